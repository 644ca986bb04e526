"""Prefill/decode disaggregation against one co-located worker with chunked prefill.

Workload: Poisson arrivals mixing long prompts (2,000 tokens, 32 new tokens) into steady
decode traffic (64-token prompts, 128 new tokens), streamed through /generate behind the
unmodified sglang-router (`--pd-disaggregation` for PD, one worker otherwise). Per request:
TTFT = arrival -> first token; TPOT = (e2e - TTFT) / (tokens - 1); ITL = gaps between events.

Systems (the medium tiny Llama, bf16 where the CPU has fast bf16, else fp32; chunked
prefill 512 everywhere):
  - PD, 1 core each: a prefill worker pinned to core 0 and a decode worker pinned to core 1
    (`taskset`, `--num-threads 1`); KV moves over NIXL (UCX) on this host.
  - co-located, 2 cores: one worker on both cores (the same hardware as PD).
  - co-located, 1 core: one worker on core 0 (what each PD worker gets).
The router and this client are not pinned; they share the two cores with the workers.

Transfers: the prefill worker's write time and bytes under that load, and again with the
workers idle (long prompts one at a time), next to raw TCP over 127.0.0.1 measured in the
same run with a payload of one long prompt's KV.

    .venv/bin/python benchmarks/bench_pd.py [--rate 2] [--requests 80] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serving import SPEC, _pcts, start_server, stop_server, stream
from peers import dtype_name

from arbor.runtime.tiny_model import make_tiny_model

OUT = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"
LONG, SHORT = (2000, 32), (64, 128)  # (prompt tokens, new tokens)
CHUNK = "512"
SYSTEMS = {"pd": "PD, 1 core each", "co2": "co-located, 2 cores", "co1": "co-located, 1 core"}
TRANSFER = ("kv_transfers", "kv_transfer_bytes", "kv_transfer_seconds", "kv_transfer_failures")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The PD secret that the router (its --api-key) and both workers share; in the environment,
# which every process started here inherits, never on a command line.
SECRET = os.environ.setdefault("ARBOR_PD_SECRET", secrets.token_hex(32))
_KEYED_LAUNCH = (
    "import os, sys; from sglang_router.launch_router import main; "
    "sys.argv += ['--api-key', os.environ['ARBOR_PD_SECRET']]; main()"
)
AUTH = {"Authorization": f"Bearer {SECRET}"}


def start_router(workers: list[int], pd: tuple[int, int, int] | None = None) -> tuple[subprocess.Popen, int]:
    """sglang-router on 127.0.0.1 over worker ports; `pd` = (prefill port, its bootstrap port,
    decode port) for PD mode, where it presents the PD secret to the workers (and asks its
    clients for it)."""
    port = _free_port()
    launch = ["-c", _KEYED_LAUNCH] if pd else ["-m", "sglang_router.launch_router"]
    cmd = [
        sys.executable,
        *launch,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--policy",
        "round_robin",
        "--log-level",
        "warn",
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(_free_port()),
    ]
    if pd is None:
        cmd += ["--worker-urls", *[f"http://127.0.0.1:{w}" for w in workers]]
    else:
        cmd += [
            "--pd-disaggregation",
            "--prefill",
            f"http://127.0.0.1:{pd[0]}",
            str(pd[1]),
            "--decode",
            f"http://127.0.0.1:{pd[2]}",
        ]
    proc = subprocess.Popen(cmd)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # listening, with its workers registered
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", headers=AUTH, timeout=5).json().get("data"):
                return proc, port
        except (httpx.TransportError, ValueError):
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError("sglang-router never listed the model")


def stats(port: int) -> dict[str, float]:
    return httpx.get(f"http://127.0.0.1:{port}/get_server_info", headers=AUTH, timeout=10).json()["stats"]


# --------------------------------------------------------------- workload


def workload(n: int, long_share: float, seed: int) -> list[tuple[str, list[int], int]]:
    """(kind, prompt ids, new tokens) per request; random ids, so no prefix is shared."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        kind, (plen, new) = ("long", LONG) if rng.random() < long_share else ("short", SHORT)
        out.append((kind, [rng.randrange(1000, 30000) for _ in range(plen)], new))
    return out


async def one(port: int, ids: list[int], new: int, delay: float) -> dict[str, Any]:
    await asyncio.sleep(delay)
    t0 = time.perf_counter()
    times, events = await stream(
        port,
        "/generate",
        {
            "input_ids": ids,
            "stream": True,
            "sampling_params": {"max_new_tokens": new, "temperature": 0, "ignore_eos": True},
        },
        SECRET,
    )
    if not events or "output_ids" not in events[-1]:
        raise RuntimeError(f"a request failed: {events[-1] if events else 'no events'}")
    tokens = len(events[-1]["output_ids"])
    ttft, e2e = times[0] - t0, times[-1] - t0
    return {
        "ttft": ttft,
        "tokens": tokens,
        "tpot": (e2e - ttft) / max(tokens - 1, 1),
        "itl": [b - a for a, b in itertools.pairwise(times)],
    }


async def mixed_run(port: int, reqs: list[tuple[str, list[int], int]], rate: float, seed: int) -> dict[str, Any]:
    rng = random.Random(seed + 1)
    delays = list(itertools.accumulate(rng.expovariate(rate) for _ in reqs))
    start = time.perf_counter()
    results = await asyncio.gather(*(one(port, ids, new, d) for (_, ids, new), d in zip(reqs, delays)))
    wall = time.perf_counter() - start
    row: dict[str, Any] = {"wall_s": wall, "throughput_tok_s": sum(r["tokens"] for r in results) / wall}
    for kind in ("short", "long"):
        mine = [r for kind_, r in zip((q[0] for q in reqs), results) if kind_ == kind]
        row[kind] = {
            "requests": len(mine),
            **_pcts("ttft", [r["ttft"] for r in mine]),
            **_pcts("tpot", [r["tpot"] for r in mine]),
            **_pcts("itl", [x for r in mine for x in r["itl"]]),
        }
    return row


# ------------------------------------------------------------------ systems


def run_system(name: str, model: Path, dtype: str, reqs: list, rate: float, idle_probes: int) -> dict[str, Any]:
    common = ("--dtype", dtype, "--chunked-prefill-size", CHUNK)
    procs: list[subprocess.Popen] = []
    try:
        if name.startswith("PD"):
            boot = _free_port()
            prefill, pport = start_server(
                model,
                *common,
                "--num-threads",
                "1",
                "--disaggregation-mode",
                "prefill",
                "--disaggregation-bootstrap-port",
                str(boot),
                cpus="0",
            )
            procs.append(prefill)
            decode, dport = start_server(
                model,
                *common,
                "--num-threads",
                "1",
                "--disaggregation-mode",
                "decode",
                "--disaggregation-prefill-peers",
                f"127.0.0.1:{boot}",
                cpus="1",
            )
            procs.append(decode)
            router, port = start_router([], pd=(pport, boot, dport))
        else:
            cores = "0,1" if "2 cores" in name else "0"
            worker, wport = start_server(model, *common, "--num-threads", str(len(cores.split(","))), cpus=cores)
            procs.append(worker)
            router, port = start_router([wport])
        procs.append(router)
        warm = workload(4, 0.5, seed=99)
        asyncio.run(mixed_run(port, warm, 4.0, seed=99))
        before = stats(pport) if name.startswith("PD") else {}
        row = asyncio.run(mixed_run(port, reqs, rate, seed=0))
        if name.startswith("PD"):
            row["transfer_load"] = _delta(before, stats(pport))
            row["decode_side"] = _delta({}, stats(dport))
            before = stats(pport)
            for _, ids, _ in workload(idle_probes, 1.0, seed=7):
                asyncio.run(one(port, ids, 1, 0))
            row["transfer_idle"] = _delta(before, stats(pport))
        return row
    finally:
        for proc in reversed(procs):
            if "sglang_router" in " ".join(proc.args[1:3]):
                proc.terminate()
                proc.wait(10)
            else:
                stop_server(proc)


def _delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    d = {k: after[k] - before.get(k, 0.0) for k in TRANSFER}
    n, secs = d["kv_transfers"], d["kv_transfer_seconds"]
    d["per_request_ms"] = secs / n * 1e3 if n else 0.0
    d["mb_per_s"] = d["kv_transfer_bytes"] / secs / 1e6 if secs else 0.0
    return d


def staging_cost(dtype: str, repeats: int = 15) -> dict[str, float]:
    """What a decode worker pays per pull for never registering its pool: a zeroed staging
    buffer for one long prompt, registered with NIXL (stage), then copied into pool slots and
    deregistered (unstage). One thread, as a PD worker here has; medians."""
    import torch

    from arbor.runtime.disaggregation.transfer import NixlTransfer
    from arbor.runtime.kv.pool import KVPool

    torch.set_num_threads(1)
    head_dim = SPEC.hidden // SPEC.heads
    pool = KVPool(10 * LONG[0], SPEC.layers, SPEC.kv_heads, head_dim, getattr(torch, dtype), torch.device("cpu"))
    transfer = NixlTransfer(pool, "decode", "127.0.0.1", None)
    slots = torch.randperm(pool.num_slots)[: LONG[0]]
    stage, unstage = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        staging = transfer.stage(LONG[0])
        t1 = time.perf_counter()
        transfer.unstage(staging, slots)
        stage.append(t1 - t0)
        unstage.append(time.perf_counter() - t1)
    transfer.close()
    return {"stage_ms": statistics.median(stage) * 1e3, "unstage_ms": statistics.median(unstage) * 1e3}


def tcp_bandwidth(nbytes: int, repeats: int) -> dict[str, float]:
    """Raw TCP over 127.0.0.1: one sender thread, one receiver; median of `repeats` sends."""
    server = socket.create_server(("127.0.0.1", 0))
    payload = bytes(nbytes)
    times = []

    def receive(conn: socket.socket) -> None:
        buf = bytearray(1 << 20)
        for _ in range(repeats):
            got = 0
            while got < nbytes:
                got += conn.recv_into(buf, min(len(buf), nbytes - got))
            conn.sendall(b"k")

    with socket.create_connection(server.getsockname()) as client:
        conn, _ = server.accept()
        reader = threading.Thread(target=receive, args=(conn,))
        reader.start()
        for _ in range(repeats):
            t0 = time.perf_counter()
            client.sendall(payload)
            client.recv(1)
            times.append(time.perf_counter() - t0)
        reader.join()
        conn.close()
    server.close()
    t = statistics.median(times)
    return {"bytes": nbytes, "ms": t * 1e3, "mb_per_s": nbytes / t / 1e6}


# ------------------------------------------------------------------- report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=2.0, help="Poisson arrival rate (requests/s)")
    ap.add_argument("--requests", type=int, default=80, help="requests in the timed run")
    ap.add_argument("--long-share", type=float, default=0.25, help="share of 2,000-token prompts")
    ap.add_argument("--idle-probes", type=int, default=5, help="long prompts sent one at a time (PD transfer)")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated, from: {', '.join(SYSTEMS)}")
    ap.add_argument("--quick", action="store_true", help="small sizes, for a smoke run (nothing saved)")
    args = ap.parse_args()
    if args.quick:
        args.requests, args.idle_probes = 12, 2
    systems = [SYSTEMS[s] for s in args.systems.split(",")]
    dtype = dtype_name()
    model = make_tiny_model(Path(tempfile.mkdtemp()) / "medium", SPEC)
    reqs = workload(args.requests, args.long_share, seed=0)
    result: dict[str, Any] = {
        "dtype": dtype,
        "rate": args.rate,
        "requests": args.requests,
        "long_share": args.long_share,
        "chunked_prefill_size": int(CHUNK),
        "kv_bytes_per_token": _kv_bytes_per_token(dtype),
        "systems": {},
    }
    for name in systems:
        print(f"running {name} ...", flush=True)
        result["systems"][name] = run_system(name, model, dtype, reqs, args.rate, args.idle_probes)
    one_prompt = LONG[0] * result["kv_bytes_per_token"]
    result["tcp"] = tcp_bandwidth(one_prompt, repeats=9)
    if "pd" in args.systems.split(","):
        result["staging"] = staging_cost(dtype)
    report(result)
    if not args.quick:
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "bench_pd.json").write_text(json.dumps(result, indent=2))
        chart(result)


def _kv_bytes_per_token(dtype: str) -> int:
    head_dim = SPEC.hidden // SPEC.heads
    return SPEC.layers * 2 * SPEC.kv_heads * head_dim * (2 if dtype == "bfloat16" else 4)


def report(r: dict[str, Any]) -> None:
    print(
        f"\nmedium tiny Llama, {r['dtype']}, 2-core CPU; Poisson {r['rate']:g} req/s, {r['requests']} requests, "
        f"{r['long_share']:.0%} of them {LONG[0]}-token prompts"
    )
    print(
        "| system | short TPOT p50 / p99 ms | short ITL p99 ms | short TTFT p50 / p99 ms "
        "| long TTFT p50 / p99 ms | tok/s |"
    )
    print("|---|---|---|---|---|---|")
    for name, c in r["systems"].items():
        s, lg = c["short"], c["long"]
        print(
            f"| {name} | {s['tpot_p50_ms']:.1f} / {s['tpot_p99_ms']:.1f} | {s['itl_p99_ms']:.0f} | "
            f"{s['ttft_p50_ms']:.0f} / {s['ttft_p99_ms']:.0f} | {lg['ttft_p50_ms']:.0f} / {lg['ttft_p99_ms']:.0f} | "
            f"{c['throughput_tok_s']:.0f} |"
        )
    t = r["tcp"]
    print(f"\nKV transfer (prefill worker's write time; {r['kv_bytes_per_token']} bytes of KV per token)")
    print("| measured | transfers | failures | MB/transfer | ms/transfer | MB/s |")
    print("|---|---|---|---|---|---|")
    for name, c in r["systems"].items():
        for when in ("transfer_load", "transfer_idle"):
            if when in c:
                d = c[when]
                mb = d["kv_transfer_bytes"] / max(d["kv_transfers"], 1) / 1e6
                print(
                    f"| {name}, {when.split('_')[1]} | {d['kv_transfers']:.0f} | {d['kv_transfer_failures']:.0f} | "
                    f"{mb:.2f} | {d['per_request_ms']:.2f} | {d['mb_per_s']:.0f} |"
                )
    print(
        f"| raw TCP 127.0.0.1, one long prompt's KV | - | - | {t['bytes'] / 1e6:.2f} | {t['ms']:.2f} | "
        f"{t['mb_per_s']:.0f} |"
    )
    if "staging" in r:
        st = r["staging"]
        print(
            f"\nThe decode worker's staging buffer for one {LONG[0]}-token prompt ({t['bytes'] / 1e6:.2f} MB, one "
            f"thread): zero + register {st['stage_ms']:.2f} ms, copy into the pool + deregister "
            f"{st['unstage_ms']:.2f} ms"
        )


def chart(r: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(r["systems"])
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for i, key in enumerate(("tpot_p50_ms", "tpot_p99_ms")):
        axes[0].bar(
            [x + i * 0.4 for x in range(len(names))],
            [r["systems"][n]["short"][key] for n in names],
            0.4,
            label=key.replace("_ms", ""),
        )
    axes[0].set_title("Short requests' TPOT (ms)")
    for i, key in enumerate(("ttft_p50_ms", "ttft_p99_ms")):
        axes[1].bar(
            [x + i * 0.4 for x in range(len(names))],
            [r["systems"][n]["long"][key] for n in names],
            0.4,
            label=key.replace("_ms", ""),
        )
    axes[1].set_title(f"{LONG[0]}-token prompts' TTFT (ms)")
    for ax in axes[:2]:
        ax.set_xticks([x + 0.2 for x in range(len(names))], names, fontsize=8)
        ax.legend()
    bars = {
        f"{n}, {w.split('_')[1]}": r["systems"][n][w]["mb_per_s"]
        for n in names
        for w in ("transfer_load", "transfer_idle")
        if w in r["systems"][n]
    }
    bars["raw TCP"] = r["tcp"]["mb_per_s"]
    axes[2].bar(list(bars), list(bars.values()), color="tab:green")
    axes[2].set_title("KV transfer vs raw TCP (MB/s)")
    axes[2].tick_params(axis="x", labelsize=7)
    fig.suptitle(
        f"Prefill/decode disaggregation, medium tiny Llama, {r['dtype']}, 2-core CPU, Poisson {r['rate']:g} req/s"
    )
    fig.tight_layout()
    fig.savefig(OUT / "bench_pd.png", dpi=100)


if __name__ == "__main__":
    main()
