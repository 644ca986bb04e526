"""The systems Arbor's benchmarks compare against, started the way `../shared/tools/README.md`
says is fair, and one OpenAI-completions client that drives them all alike.

Peers live under `~/.cache/arbor-peers` (made by `../shared/tools/peers.sh`): `ckpt/` (the
transformers-written checkpoint), `vllm/venv`, `llama/build/bin/llama-server` and
`gguf/model-bf16.gguf`. A peer that is absent is skipped with the reason.

Every request: `/v1/completions` with a token-id prompt, `max_tokens` = `min_tokens` = the
wanted output length, `ignore_eos`, temperature 0, so every system produces exactly the
requested tokens.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

PEERS = Path(os.environ.get("ARBOR_PEERS", Path.home() / ".cache" / "arbor-peers"))
CKPT = PEERS / "ckpt"
VLLM_PY = PEERS / "vllm" / "venv" / "bin" / "python"
LLAMA_BIN = PEERS / "llama" / "build" / "bin" / "llama-server"
GGUF = PEERS / "gguf"
VOCAB = 50000
Workload = list[tuple[list[int], int]]  # (prompt ids, output tokens)


# --------------------------------------------------------------- workloads


def w1() -> Workload:
    """Mixed: 64 requests, prompt 32-256, output 16-128 tokens."""
    rng = random.Random(0)
    return [([rng.randrange(VOCAB) for _ in range(rng.randint(32, 256))], rng.randint(16, 128)) for _ in range(64)]


def w2() -> Workload:
    """One shared 1,024-token prefix, 32 distinct 32-token suffixes, 32 output tokens each."""
    rng = random.Random(1)
    prefix = [rng.randrange(VOCAB) for _ in range(1024)]
    return [(prefix + [rng.randrange(VOCAB) for _ in range(32)], 32) for _ in range(32)]


def warmup() -> Workload:
    """Ids no workload draws (>= VOCAB)."""
    return [([VOCAB + i for i in range(48)], 8)]


# ----------------------------------------------------------------- systems


@dataclass
class System:
    """A started server: its name, port and model id, and notes for the report."""

    name: str
    port: int
    model: str
    notes: str = ""
    proc: subprocess.Popen | None = field(default=None, repr=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dtype_name() -> str:
    """bf16 where the CPU has fast bf16 matmuls, else fp32: the same for every system."""
    flags = Path("/proc/cpuinfo").read_text()
    return "bfloat16" if "avx512_bf16" in flags or "amx_bf16" in flags else "float32"


def absent_peers() -> dict[str, str]:
    """Peers that cannot run here, with why."""
    out = {}
    if not CKPT.exists():
        out["all peers"] = f"no peer checkpoint at {CKPT} (run ../shared/tools/peers.sh ckpt {CKPT})"
    if not VLLM_PY.exists():
        out["vllm"] = f"no vLLM venv at {VLLM_PY.parent.parent} (../shared/tools/peers.sh vllm)"
    if not LLAMA_BIN.exists() or not (GGUF / "model-bf16.gguf").exists():
        out["llama-server"] = f"no {LLAMA_BIN} or {GGUF}/model-bf16.gguf (../shared/tools/peers.sh llama-server / gguf)"
    return out


def _wait_ready(proc: subprocess.Popen, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before it was ready")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    proc.kill()
    raise RuntimeError(f"server on port {port} not ready after {timeout:.0f} s")


@contextmanager
def serve(
    name: str, cmd: list[str], env: dict[str, str] | None = None, notes: str = "", timeout: float = 600
) -> Iterator[System]:
    """Start a server on 127.0.0.1 (its command takes the port via `{port}`), wait until
    `/v1/models` answers, yield it, and stop it."""
    port = free_port()
    log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-{name}.log", "w")  # noqa: SIM115
    # A session of its own, so stopping it stops its children too (vLLM's engine core
    # outlived a timed-out server once and took a core from the next measurement).
    proc = subprocess.Popen(
        [c.format(port=port) for c in cmd],
        env={**os.environ, **(env or {})},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        _wait_ready(proc, port, timeout)
        model = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).json()["data"][0]["id"]
        yield System(name, port, model, notes, proc)
    finally:
        _stop_group(proc)
        log.close()


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the server's whole process group; 30 s later (or once the leader is gone and
    its children had a second), SIGKILL whatever is left of it."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    with suppress(subprocess.TimeoutExpired):
        proc.wait(30)
    time.sleep(1)
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def arbor(dtype: str, *extra: str) -> Any:
    cmd = [
        sys.executable,
        "-m",
        "arbor",
        "serve",
        "--model-path",
        str(CKPT),
        "--port",
        "{port}",
        "--dtype",
        dtype,
        "--max-running-requests",
        "64",
        "--log-level",
        "warning",
        *extra,
    ]
    return serve("arbor", cmd, notes=" ".join(extra))


def vllm(
    dtype: str,
    threads: int | None = None,
    model: Path = CKPT,
    name: str | None = None,
    extra: list[str] | None = None,
    timeout: float = 600,
) -> Any:
    """vLLM's CPU build; `threads` None keeps its default (one torch thread on 2 cores)."""
    env = {"VLLM_CPU_KVCACHE_SPACE": "4"}
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    cmd = [
        str(VLLM_PY),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--dtype",
        dtype,
        "--host",
        "127.0.0.1",
        "--port",
        "{port}",
        "--max-num-seqs",
        "64",
        *(extra or []),
    ]
    name = name or ("vllm" if threads is None else f"vllm-omp{threads}")
    return serve(
        name, cmd, env, notes="default threads" if threads is None else f"OMP_NUM_THREADS={threads}", timeout=timeout
    )


def llama_server(dtype: str, slots: int, ctx_per_slot: int = 2048) -> Any:
    gguf = GGUF / ("model-bf16.gguf" if dtype == "bfloat16" else "model-f32.gguf")
    threads = str(os.cpu_count() or 2)
    cmd = [
        str(LLAMA_BIN),
        "-m",
        str(gguf),
        "-t",
        threads,
        "-tb",
        threads,
        "-c",
        str(slots * ctx_per_slot),
        "-np",
        str(slots),
        "-fa",
        "on",
        "--host",
        "127.0.0.1",
        "--port",
        "{port}",
    ]
    return serve(f"llama-server-{slots}", cmd, notes=f"{slots} slots, flash attention")


# ------------------------------------------------------------------ client


def body(system: System, prompt: list[int], out_len: int, stream: bool = False) -> dict[str, Any]:
    req = {
        "model": system.model,
        "prompt": prompt,
        "max_tokens": out_len,
        "min_tokens": out_len,
        "ignore_eos": True,
        "temperature": 0,
        "stream": stream,
    }
    if system.name.startswith("llama-server"):
        req["cache_prompt"] = True
    return req


async def _complete(client: httpx.AsyncClient, system: System, prompt: list[int], out_len: int) -> dict[str, Any]:
    r = await client.post(f"http://127.0.0.1:{system.port}/v1/completions", json=body(system, prompt, out_len))
    r.raise_for_status()
    return r.json()


async def _stream(client: httpx.AsyncClient, system: System, prompt: list[int], out_len: int) -> list[float]:
    """Arrival times of the streamed events that carry text."""
    times = []
    url = f"http://127.0.0.1:{system.port}/v1/completions"
    async with client.stream("POST", url, json=body(system, prompt, out_len, stream=True)) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("choices") and event["choices"][0].get("text") is not None:
                times.append(time.perf_counter())
    return times


def client() -> httpx.AsyncClient:
    """A connection per request (no keep-alive): a server that closes an idle kept-alive
    connection (llama-server did, once, mid-run) must not fail the next request."""
    return httpx.AsyncClient(
        timeout=httpx.Timeout(1800), limits=httpx.Limits(max_connections=256, max_keepalive_connections=0)
    )


async def run_all(system: System, work: Workload) -> float:
    """Send every request at once; the wall time until the last one finishes."""
    async with client() as c:
        t0 = time.perf_counter()
        outs = await asyncio.gather(*(_complete(c, system, p, o) for p, o in work))
        wall = time.perf_counter() - t0
    got = sum(o["usage"]["completion_tokens"] for o in outs)
    want = sum(o for _, o in work)
    if got != want:
        raise RuntimeError(f"{system.name} produced {got} tokens, {want} requested")
    return wall


def throughput(system: System, work: Workload) -> dict[str, float]:
    """Output tokens/s of `work` sent at once, after a warm-up request."""
    asyncio.run(run_all(system, warmup()))
    wall = asyncio.run(run_all(system, work))
    return {"wall_s": wall, "tok_s": sum(o for _, o in work) / wall}


def chat_trace(system: System, convs: int = 8, turns: int = 4) -> dict[str, float]:
    """Multi-turn replay: conversations run concurrently, turns in order; turn t's prompt is
    the system prompt and every earlier turn (user ids + the trace's recorded reply ids) plus
    the new user ids, so each system sees the same prompts whatever it generates."""
    rng = random.Random(2)
    systems = [[rng.randrange(VOCAB) for _ in range(200)] for _ in range(convs)]
    users = [[[rng.randrange(VOCAB) for _ in range(40)] for _ in range(turns)] for _ in range(convs)]
    replies = [[[rng.randrange(VOCAB) for _ in range(32)] for _ in range(turns)] for _ in range(convs)]
    ttfts: list[float] = []

    async def conversation(c: httpx.AsyncClient, i: int) -> None:
        history = list(systems[i])
        for t in range(turns):
            history += users[i][t]
            t0 = time.perf_counter()
            times = await _stream(c, system, history, 32)
            ttfts.append(times[0] - t0)
            history += replies[i][t]

    async def run() -> float:
        async with client() as c:
            t0 = time.perf_counter()
            await asyncio.gather(*(conversation(c, i) for i in range(convs)))
            return time.perf_counter() - t0

    asyncio.run(run_all(system, warmup()))
    wall = asyncio.run(run())
    ttfts.sort()
    return {
        "wall_s": wall,
        "tok_s": convs * turns * 32 / wall,
        "ttft_p50_ms": ttfts[len(ttfts) // 2] * 1e3,
        "ttft_p99_ms": ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))] * 1e3,
    }


def poisson(system: System, rate: float, n: int, seed: int) -> dict[str, float]:
    """Streamed requests (prompt 64-256, output 32-128) arriving as a Poisson process."""
    rng = random.Random(seed)
    reqs = [([rng.randrange(VOCAB) for _ in range(rng.randint(64, 256))], rng.randint(32, 128)) for _ in range(n)]
    starts, t = [], 0.0
    for _ in range(n):
        t += rng.expovariate(rate)
        starts.append(t)

    async def one(c: httpx.AsyncClient, ids: list[int], out_len: int, delay: float) -> dict[str, Any]:
        await asyncio.sleep(delay)
        t0 = time.perf_counter()
        times = await _stream(c, system, ids, out_len)
        ttft, e2e = times[0] - t0, times[-1] - t0
        return {
            "ttft": ttft,
            "tpot": (e2e - ttft) / max(out_len - 1, 1),
            "itl": [b - a for a, b in itertools.pairwise(times)],
        }

    async def run() -> tuple[float, list[dict[str, Any]]]:
        async with client() as c:
            t0 = time.perf_counter()
            res = await asyncio.gather(*(one(c, ids, o, d) for (ids, o), d in zip(reqs, starts)))
            return time.perf_counter() - t0, res

    asyncio.run(run_all(system, warmup()))
    wall, res = asyncio.run(run())
    out = {"rate": rate, "requests": n, "tok_s": sum(o for _, o in reqs) / wall}
    for key, xs in (
        ("ttft", [r["ttft"] for r in res]),
        ("tpot", [r["tpot"] for r in res]),
        ("itl", [x for r in res for x in r["itl"]]),
    ):
        xs = sorted(xs)
        out[f"{key}_p50_ms"] = xs[len(xs) // 2] * 1e3
        out[f"{key}_p99_ms"] = xs[min(len(xs) - 1, int(0.99 * len(xs)))] * 1e3
    return out
