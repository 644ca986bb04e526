"""Online serving: Poisson arrivals against a live `arbor serve`, and a multi-turn chat trace
with the radix cache on and off; then (peers) Arbor beside vLLM's CPU build and llama.cpp's
server on the peer checkpoint, the same Poisson traffic at 1, 2 and 4 req/s sent to each over
streamed /v1/completions (benchmarks/peers.py).

Every request streams (native /generate, SSE), so the client sees each token as it leaves:
TTFT = arrival -> first token; ITL = gaps between streamed events; TPOT = (e2e - TTFT) /
(tokens - 1). Percentiles over all requests of a rate. The chat trace runs conversations
concurrently, turns in order, through /v1/chat/completions (streamed).
Table on stdout; JSON + PNG into docs/benchmarks/.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from arbor.runtime.tiny_model import TinySpec, make_tiny_model

OUT = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"
SPEC = TinySpec(arch="llama", layers=8, hidden=512, heads=8, kv_heads=4)


# ------------------------------------------------------------------ server


def start_server(model: Path, *extra: str, cpus: str | None = None) -> tuple[subprocess.Popen, int]:
    """`arbor serve` on a free port; `cpus` (a taskset list, "0" or "0,1") pins it and its children."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pin = ["taskset", "-c", cpus] if cpus else []
    proc = subprocess.Popen(
        [
            *pin,
            sys.executable,
            "-m",
            "arbor",
            "serve",
            "--model-path",
            str(model),
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--enable-cache-report",
            *extra,
        ]
    )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as c:
                c.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                if b"200 OK" in c.recv(1024):
                    return proc, port
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("arbor serve did not start")


def stop_server(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


async def stream(
    port: int, path: str, body: dict[str, Any], key: str | None = None
) -> tuple[list[float], list[dict[str, Any]]]:
    """POST a streaming request (with `key` as its bearer token); the arrival time of each
    `data:` event and the events."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = json.dumps(body).encode()
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    # HTTP/1.0: the answer comes without chunked transfer encoding, whose chunk-size lines
    # would otherwise land inside an event wherever a chunk splits one (sglang-router's do).
    writer.write(
        f"POST {path} HTTP/1.0\r\nHost: x\r\nContent-Type: application/json\r\n{auth}"
        f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    await writer.drain()
    times, events = [], []
    while line := await reader.readline():
        if line.startswith(b"data: "):
            if line.strip() == b"data: [DONE]":
                break
            times.append(time.perf_counter())
            events.append(json.loads(line[6:]))
    writer.close()
    return times, events


# --------------------------------------------------------------- workloads


async def poisson_run(port: int, rate: float, n: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    reqs = [([rng.randrange(50000) for _ in range(rng.randint(64, 256))], rng.randint(32, 128)) for _ in range(n)]
    gaps = [rng.expovariate(rate) for _ in range(n)]

    async def one(ids: list[int], out_len: int, delay: float) -> dict[str, float]:
        await asyncio.sleep(delay)
        t0 = time.perf_counter()
        times, events = await stream(
            port,
            "/generate",
            {
                "input_ids": ids,
                "stream": True,
                "sampling_params": {"max_new_tokens": out_len, "temperature": 0, "ignore_eos": True},
            },
        )
        tokens = len(events[-1]["output_ids"])
        ttft, e2e = times[0] - t0, times[-1] - t0
        return {
            "ttft": ttft,
            "e2e": e2e,
            "tokens": tokens,
            "itl": [b - a for a, b in itertools.pairwise(times)],
            "tpot": (e2e - ttft) / max(tokens - 1, 1),
        }

    start = time.perf_counter()
    delays = [sum(gaps[: i + 1]) for i in range(n)]
    results = await asyncio.gather(*(one(ids, o, d) for (ids, o), d in zip(reqs, delays)))
    wall = time.perf_counter() - start
    itl = sorted(x for r in results for x in r["itl"])
    return {
        "rate": rate,
        "requests": n,
        "wall_s": wall,
        "throughput_tok_s": sum(r["tokens"] for r in results) / wall,
        **_pcts("ttft", [r["ttft"] for r in results]),
        **_pcts("tpot", [r["tpot"] for r in results]),
        **_pcts("itl", itl),
        **_pcts("e2e", [r["e2e"] for r in results]),
    }


def _pcts(name: str, xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {
        f"{name}_p50_ms": statistics.median(xs) * 1e3,
        f"{name}_p99_ms": xs[min(len(xs) - 1, int(0.99 * len(xs)))] * 1e3,
    }


async def chat_trace(port: int, model: str, convs: int, turns: int) -> dict[str, Any]:
    rng = random.Random(7)
    systems = [" ".join(f"rule{rng.randrange(10**6)}" for _ in range(120)) for _ in range(convs)]
    ttfts, cached, prompt = [], 0, 0

    async def conversation(c: int) -> None:
        nonlocal cached, prompt
        messages = [{"role": "system", "content": systems[c]}]
        for t in range(turns):
            messages.append(
                {"role": "user", "content": f"Turn {t}: " + " ".join(f"w{rng.randrange(10**5)}" for _ in range(30))}
            )
            t0 = time.perf_counter()
            times, events = await stream(
                port,
                "/v1/chat/completions",
                {
                    "model": model,
                    "messages": messages,
                    "max_tokens": 32,
                    "temperature": 0,
                    "ignore_eos": True,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                },
            )
            ttfts.append(
                next(ts for ts, e in zip(times, events) if e["choices"] and e["choices"][0]["delta"].get("content"))
                - t0
            )
            usage = events[-1]["usage"]
            cached += usage["prompt_tokens_details"]["cached_tokens"]
            prompt += usage["prompt_tokens"]
            text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
            messages.append({"role": "assistant", "content": text})

    start = time.perf_counter()
    await asyncio.gather(*(conversation(c) for c in range(convs)))
    return {
        "conversations": convs,
        "turns": turns,
        "wall_s": time.perf_counter() - start,
        "cached_tokens": cached,
        "prompt_tokens": prompt,
        "hit_rate": cached / prompt,
        **_pcts("ttft", ttfts),
    }


# ----------------------------------------------------------------- report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="0.5,1,2", help="Poisson request rates (requests/s)")
    ap.add_argument("--requests", type=int, default=40, help="requests per rate")
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    ap.add_argument("--sections", default="cache,peers", help="comma-separated: cache (tiny model), peers")
    ap.add_argument("--peer-rates", default="1,2,4", help="Poisson rates of the peers section")
    ap.add_argument("--peer-requests", type=int, default=48, help="requests per rate, peers section")
    ap.add_argument("--systems", default="arbor,vllm,vllm-omp,llama-server", help="systems of the peers section")
    args = ap.parse_args()
    sections = set(args.sections.split(","))
    saved = OUT / "bench_serving.json"
    result: dict[str, Any] = json.loads(saved.read_text()) if saved.exists() and not args.quick else {}
    if "peers" in sections:
        result["peers"] = run_peers(
            args.systems.split(","), [float(r) for r in args.peer_rates.split(",")], args.peer_requests
        )
        report_peers(result["peers"])
        if not args.quick:
            OUT.mkdir(parents=True, exist_ok=True)
            saved.write_text(json.dumps(result, indent=2))
            chart(result)
    if "cache" not in sections:
        return
    if args.quick:
        args.rates, args.requests, args.conversations, args.turns = "1,4", 8, 2, 2
    model = make_tiny_model(Path(tempfile.mkdtemp()) / "medium", SPEC)
    rows, chat = [], {}
    proc, port = start_server(model)
    try:
        for i, rate in enumerate(float(r) for r in args.rates.split(",")):
            rows.append(asyncio.run(poisson_run(port, rate, args.requests, seed=i)))
        chat["cache_on"] = asyncio.run(chat_trace(port, model.name, args.conversations, args.turns))
    finally:
        stop_server(proc)
    proc, port = start_server(model, "--disable-radix-cache")
    try:
        chat["cache_off"] = asyncio.run(chat_trace(port, model.name, args.conversations, args.turns))
    finally:
        stop_server(proc)
    result.update(spec={"layers": SPEC.layers, "hidden": SPEC.hidden}, poisson=rows, chat=chat)
    report(result)
    if not args.quick:
        OUT.mkdir(parents=True, exist_ok=True)
        saved.write_text(json.dumps(result, indent=2))
        chart(result)


def run_peers(systems: list[str], rates: list[float], n: int) -> dict[str, Any]:
    """The same Poisson traffic (seeded per rate) against each available system."""
    sys.path.insert(0, str(Path(__file__).parent))
    import peers

    dtype = peers.dtype_name()
    absent = peers.absent_peers()
    out: dict[str, Any] = {"dtype": dtype, "requests": n, "skipped": dict(absent), "systems": {}}
    if "all peers" in absent:
        return out
    servers = {
        "arbor": ("arbor", lambda: peers.arbor(dtype)),
        "vllm": ("vllm (1 thread, default)", lambda: peers.vllm(dtype)),
        "vllm-omp": (f"vllm (OMP_NUM_THREADS={os.cpu_count()})", lambda: peers.vllm(dtype, os.cpu_count())),
        "llama-server": ("llama-server (16 slots)", lambda: peers.llama_server(dtype, 16)),
    }
    for key in systems:
        if key in absent or key not in servers:
            continue
        name, start = servers[key]
        with start() as system:
            out["systems"][name] = []
            for i, rate in enumerate(rates):
                try:
                    row = peers.poisson(system, rate, n, seed=10 + i)
                except Exception as exc:  # one failing peer run must not lose the others
                    out["skipped"][f"{name} {rate} req/s"] = f"failed: {type(exc).__name__}: {exc}"
                    continue
                out["systems"][name].append(row)
                print(
                    f"  {name:26} {rate:>4} req/s  TTFT p50 {row['ttft_p50_ms']:7.0f}  TPOT p99 "
                    f"{row['tpot_p99_ms']:6.1f} ms",
                    flush=True,
                )
    return out


def report_peers(p: dict[str, Any]) -> None:
    print(f"\npeers: Poisson serving, {p['requests']} requests per rate, {p['dtype']} for every system (ms)")
    for name, why in p["skipped"].items():
        print(f"  skipped {name}: {why}")
    print(
        f"  {'system':26} {'rate':>5} {'tok/s':>7} {'TTFT p50':>9} {'p99':>7} {'TPOT p50':>9} {'p99':>7} "
        f"{'ITL p50':>8} {'p99':>7}"
    )
    for name, rows in p["systems"].items():
        for r in rows:
            print(
                f"  {name:26} {r['rate']:>5} {r['tok_s']:>7.1f} {r['ttft_p50_ms']:>9.0f} {r['ttft_p99_ms']:>7.0f} "
                f"{r['tpot_p50_ms']:>9.1f} {r['tpot_p99_ms']:>7.1f} {r['itl_p50_ms']:>8.1f} {r['itl_p99_ms']:>7.1f}"
            )


def report(r: dict[str, Any]) -> None:
    print(f"bench_serving: {r['spec']['layers']} layers, hidden {r['spec']['hidden']}, streamed /generate")
    print(
        f"{'rate':>5} {'tok/s':>7} {'TTFT p50':>9} {'p99':>7} {'TPOT p50':>9} {'p99':>7} {'ITL p50':>8} {'p99':>7}  (ms)"
    )
    for row in r["poisson"]:
        print(
            f"{row['rate']:>5} {row['throughput_tok_s']:>7.1f} {row['ttft_p50_ms']:>9.0f} {row['ttft_p99_ms']:>7.0f} "
            f"{row['tpot_p50_ms']:>9.1f} {row['tpot_p99_ms']:>7.1f} {row['itl_p50_ms']:>8.1f} {row['itl_p99_ms']:>7.1f}"
        )
    on, off = r["chat"]["cache_on"], r["chat"]["cache_off"]
    print(f"\nchat trace ({on['conversations']} conversations x {on['turns']} turns, /v1/chat/completions):")
    for name, c in (("cache on", on), ("cache off", off)):
        print(
            f"  {name:9} wall {c['wall_s']:6.1f} s  TTFT p50 {c['ttft_p50_ms']:6.0f} ms  p99 {c['ttft_p99_ms']:6.0f} ms"
            f"  hit rate {c['hit_rate']:.1%}"
        )
    print(
        f"  cache on: {off['wall_s'] / on['wall_s']:.2f}x faster, TTFT p50 {off['ttft_p50_ms'] / on['ttft_p50_ms']:.2f}x lower"
    )


def chart(r: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if "poisson" not in r:  # only the peers section has run
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        chart_peers(axes, r["peers"])
        fig.tight_layout()
        fig.savefig(OUT / "bench_serving.png", dpi=120)
        return
    rows = 2 if "peers" in r else 1
    fig, grid = plt.subplots(rows, 3, figsize=(13, 4 * rows), squeeze=False)
    if "peers" in r:
        chart_peers(grid[1][:2], r["peers"])
        grid[1][2].axis("off")
    axes = grid[0]
    rates = [row["rate"] for row in r["poisson"]]
    for ax, key, title in ((axes[0], "ttft", "TTFT"), (axes[1], "tpot", "TPOT")):
        ax.plot(rates, [row[f"{key}_p50_ms"] for row in r["poisson"]], "o-", label="p50")
        ax.plot(rates, [row[f"{key}_p99_ms"] for row in r["poisson"]], "s--", label="p99")
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel("ms")
        ax.set_title(title)
        ax.legend()
    chat = r["chat"]
    axes[2].bar(
        ["cache on", "cache off"],
        [chat["cache_on"]["ttft_p50_ms"], chat["cache_off"]["ttft_p50_ms"]],
        color=["C0", "C2"],
    )
    axes[2].set_ylabel("TTFT p50 (ms)")
    axes[2].set_title("multi-turn chat")
    fig.suptitle("Online serving, medium tiny Llama, 2-core CPU")
    fig.tight_layout()
    fig.savefig(OUT / "bench_serving.png", dpi=120)


def chart_peers(axes: Any, p: dict[str, Any]) -> None:
    for ax, key, title in ((axes[0], "ttft_p50_ms", "TTFT p50"), (axes[1], "tpot_p99_ms", "TPOT p99")):
        for name, rows in p["systems"].items():
            ax.plot([r["rate"] for r in rows], [r[key] for r in rows], "o-", label=name)
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel("ms")
        ax.set_title(f"{title}, peer checkpoint ({p['dtype']})")
        ax.legend(fontsize=7)


if __name__ == "__main__":
    main()
