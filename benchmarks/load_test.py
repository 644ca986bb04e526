"""Load test with locust: many concurrent streaming clients, a fifth of them hanging up
mid-stream, against one `arbor serve` on 127.0.0.1.

Pass: every request completes or gets a clean 429/503; afterwards nothing runs or waits, the
KV invariant holds, a cache flush gives back every slot (0 leaked), resident memory is back
near its start level, and /health answered within 100 ms at p99 throughout.
Table on stdout; JSON + PNG into docs/benchmarks/.

    .venv/bin/python benchmarks/load_test.py [--users 1000] [--spawn-rate 200] [--seconds 60]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from bench_serving import start_server, stop_server

OUT = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"
LOCUSTFILE = Path(__file__).resolve().parent / "load" / "locustfile.py"
HEALTH_P99_MS = 100.0
MEMORY_SLACK = 1.15  # resident memory may end at most 15% above where it started


def _get(url: str, timeout: float = 5.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def _post(url: str, body: dict | None = None) -> None:
    data = json.dumps(body or {}).encode()
    request = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=60).read()


def _rss_mb(pid: int) -> float:
    """Resident memory of a process and its children, MiB."""
    pids = [pid] + [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _ppid(p) == pid]
    total = 0
    for p in pids:
        for line in Path(f"/proc/{p}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total / 1024


def _ppid(proc: Path) -> int:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


class HealthProbe(threading.Thread):
    """GET /health every 100 ms until stopped; latencies in ms (a timeout counts as 2,000)."""

    def __init__(self, base: str) -> None:
        super().__init__(daemon=True)
        self.base, self.samples, self.stop = base, [], threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            t0 = time.perf_counter()
            try:
                urllib.request.urlopen(self.base + "/health", timeout=2).read()
                self.samples.append((t0, 1000 * (time.perf_counter() - t0)))
            except OSError:
                self.samples.append((t0, 2000.0))
            self.stop.wait(0.1)


def _locust(base: str, users: int, rate: int, seconds: int, max_new: int, prefix: str) -> dict[str, dict]:
    cmd = [
        str(Path(sys.executable).with_name("locust")),
        "-f",
        str(LOCUSTFILE),
        "--headless",
        "-u",
        str(users),
        "-r",
        str(rate),
        "-t",
        f"{seconds}s",
        "--host",
        base,
        "--csv",
        prefix,
        "--only-summary",
        "--stop-timeout",
        "30",
        "--loglevel",
        "WARNING",
    ]
    subprocess.run(cmd, env={**os.environ, "LOAD_MAX_NEW_TOKENS": str(max_new)}, timeout=seconds + 300, check=False)
    with open(prefix + "_stats.csv") as f:
        return {f"{row['Type']} {row['Name']}": row for row in csv.DictReader(f)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=1000, help="concurrent streaming clients (default: 1000)")
    parser.add_argument("--spawn-rate", type=int, default=200, help="clients started per second (default: 200)")
    parser.add_argument("--seconds", type=int, default=60, help="how long the load runs (default: 60)")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="tokens per streamed request (default: 32)")
    args = parser.parse_args()
    from arbor.runtime.tiny_model import builtin_model_path

    proc, port = start_server(builtin_model_path(), "--dtype", "float32")
    base = f"http://127.0.0.1:{port}"
    try:
        _post(base + "/generate", {"text": "warm-up", "sampling_params": {"max_new_tokens": 8}})
        start_mb = _rss_mb(proc.pid)
        probe = HealthProbe(base)
        probe.start()
        with tempfile.TemporaryDirectory() as tmp:
            stats = _locust(base, args.users, args.spawn_rate, args.seconds, args.max_new_tokens, tmp + "/load")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            server = _get(base + "/get_server_info")["stats"]
            if server["running"] == server["waiting"] == 0:
                break
            time.sleep(0.5)
        probe.stop.set()
        probe.join()
        _post(base + "/flush_cache")
        after = _get(base + "/get_server_info")["stats"]
        end_mb = _rss_mb(proc.pid)
    finally:
        stop_server(proc)
    latencies = sorted(ms for _, ms in probe.samples)
    p99 = latencies[int(0.99 * (len(latencies) - 1))] if latencies else float("nan")
    requests = sum(int(r["Request Count"]) for k, r in stats.items() if k.startswith("POST"))
    failures = sum(int(r["Failure Count"]) for k, r in stats.items() if k.startswith("POST"))
    refused = sum(int(r["Request Count"]) for k, r in stats.items() if k.startswith("REFUSED"))
    hung_up = int(stats.get("POST hang-up", {}).get("Request Count", 0))
    result = {
        "meta": {
            "users": args.users,
            "spawn_rate": args.spawn_rate,
            "seconds": args.seconds,
            "max_new_tokens": args.max_new_tokens,
            "dtype": "float32",
            "checkpoint": "built-in tiny",
            "cpus": os.cpu_count(),
        },
        "requests": requests,
        "failures": failures,
        "refused_429_503": refused,
        "hung_up_mid_stream": hung_up,
        "leaked_slots": int(after["total_slots"] - after["free_slots"]),
        "invariant_ok": after["invariant_ok"] == 1.0,
        "idle_after": after["running"] == after["waiting"] == 0,
        "rss_start_mb": round(start_mb, 1),
        "rss_end_mb": round(end_mb, 1),
        "health_p50_ms": round(statistics.median(latencies), 2) if latencies else None,
        "health_p99_ms": round(p99, 2),
        "health_max_ms": round(latencies[-1], 2) if latencies else None,
    }
    checks = {
        "no failures": failures == 0,
        "0 leaked slots": result["leaked_slots"] == 0,
        "invariant holds": result["invariant_ok"],
        "idle afterwards": result["idle_after"],
        "memory back near start": end_mb <= start_mb * MEMORY_SLACK,
        f"/health p99 < {HEALTH_P99_MS:.0f} ms": p99 < HEALTH_P99_MS,
    }
    result["checks"] = checks
    print(f"{'metric':<28}{'value':>14}")
    for key in (
        "requests",
        "failures",
        "refused_429_503",
        "hung_up_mid_stream",
        "leaked_slots",
        "rss_start_mb",
        "rss_end_mb",
        "health_p50_ms",
        "health_p99_ms",
        "health_max_ms",
    ):
        print(f"{key:<28}{result[key]!s:>14}")
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "load_test.json").write_text(json.dumps(result, indent=2))
    _chart(probe.samples, result, OUT / "load_test.png")
    return 0 if all(checks.values()) else 1


def _chart(samples: list[tuple[float, float]], result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = samples[0][0] if samples else 0.0
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.plot([t - t0 for t, _ in samples], [ms for _, ms in samples], lw=0.8)
    ax.axhline(HEALTH_P99_MS, color="red", ls="--", lw=0.8, label=f"{HEALTH_P99_MS:.0f} ms")
    ax.set_xlabel("seconds since the load started")
    ax.set_ylabel("/health latency (ms)")
    ax.set_title(
        f"{result['meta']['users']} streaming clients: {result['requests']} requests, "
        f"{result['refused_429_503']} refused, {result['failures']} failed"
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
