"""Radix cache micro-benchmark: median match / insert / evict latency on serving-like traces.

Each implementation runs in its own subprocess on identical, seeded traces:
- multiturn: 200 chats x 5 turns; a turn matches its whole history and inserts it + the answer
- fewshot:   500 questions under one 1,560-token few-shot prefix
- fork:      50 roots x 8 branches (a shared prompt forked into parallel generations)
The tree is first filled with earlier rounds of the same trace to ~100k or ~1M tokens; after
the measured round, `evict(10_000)` is timed 20 times (refilling between calls).

The peer is SGLang's RadixCache (`sglang.srt.mem_cache.radix_cache`), when importable in
`--peer-python`. Its `match_prefix` returns no indices (they are gathered later), so its
match timing does strictly less work than Arbor's, which returns them.

    python benchmarks/bench_radix.py [--peer-python PATH] [--quick]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from array import array
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT_DIR = ROOT / "docs" / "benchmarks"
VOCAB = 50_000
EVICT_TOKENS = 10_000
EVICT_REPEATS = 40

Op = tuple[str, list[int], int]  # ("match" | "insert", tokens, answer_len)


# ------------------------------------------------------------------ traces


def _tokens(rng: random.Random, lo: int, hi: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(rng.randint(lo, hi))]


def multiturn(rng: random.Random) -> Iterator[tuple[list[int], list[int]]]:
    """Yield (prompt, answer): 200 chats, their turns interleaved round-robin."""
    systems = [_tokens(rng, 150, 300) for _ in range(4)]
    history = [list(rng.choice(systems)) for _ in range(200)]
    for _turn in range(5):
        for chat in history:
            chat += _tokens(rng, 20, 80)
            answer = _tokens(rng, 40, 160)
            yield list(chat), answer
            chat += answer


def fewshot(rng: random.Random) -> Iterator[tuple[list[int], list[int]]]:
    """Yield (prompt, answer): 500 questions under one shared 1,560-token prefix."""
    prefix = _tokens(rng, 1560, 1560)
    for _ in range(500):
        yield prefix + _tokens(rng, 20, 60), _tokens(rng, 10, 40)


def fork(rng: random.Random) -> Iterator[tuple[list[int], list[int]]]:
    """Yield (prompt, answer): 50 shared prompts, each forked into 8 branches."""
    for _ in range(50):
        root = _tokens(rng, 300, 800)
        yield root, []
        for _branch in range(8):
            yield root + _tokens(rng, 5, 15), _tokens(rng, 50, 150)


TRACES = {"multiturn": multiturn, "fewshot": fewshot, "fork": fork}


def rounds(trace: str, seed: int) -> Iterator[tuple[list[int], list[int]]]:
    """Endless rounds of one trace, each with fresh content (for filling the tree)."""
    while True:
        yield from TRACES[trace](random.Random(seed))
        seed += 1


# ---------------------------------------------------------- implementations


class ArborAdapter:
    """Arbor's RadixCache with the key and value types its scheduler passes."""

    name = "arbor"

    def __init__(self, page_size: int) -> None:
        sys.path.insert(0, str(ROOT))
        from arbor.radix.cache import RadixCache

        self.cache = RadixCache(page_size)

    def key(self, tokens: list[int]) -> object:
        return array("i", tokens)

    def value(self, slots: range) -> object:
        return array("i", slots)

    def match(self, key: object) -> int:
        return self.cache.match_prefix(key).length

    def insert(self, key: object, value: object) -> None:
        self.cache.insert(key, value)

    def evict(self, num_tokens: int) -> int:
        return self.cache.evict(num_tokens, lambda slots: None)

    def size(self) -> int:
        return self.cache.total_size()


class SglangAdapter:
    """SGLang's RadixCache (simulated: no GPU pools), with its RadixKey and tensor values."""

    name = "sglang"

    def __init__(self, page_size: int) -> None:
        import torch
        from sglang.srt.mem_cache.base_prefix_cache import (
            EvictParams,
            InsertParams,
            MatchPrefixParams,
        )
        from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey

        class _Allocator:
            device = "cpu"

            def free_segment(self, value: object, start_pos: int = 0) -> None:
                pass

        self.torch, self.RadixKey = torch, RadixKey
        self.Evict, self.Insert, self.Match = EvictParams, InsertParams, MatchPrefixParams
        self.cache = RadixCache.create_simulated(mock_allocator=_Allocator(), page_size=page_size)

    def key(self, tokens: list[int]) -> object:
        return self.RadixKey(array("q", tokens))

    def value(self, slots: range) -> object:
        return self.torch.arange(slots.start, slots.stop, dtype=self.torch.int64)

    def match(self, key: object) -> int:
        return self.cache.match_prefix(self.Match(key=key)).device_prefix_len

    def insert(self, key: object, value: object) -> None:
        self.cache.insert(self.Insert(key=key, value=value))

    def evict(self, num_tokens: int) -> int:
        return self.cache.evict(self.Evict(num_tokens=num_tokens)).num_tokens_evicted

    def size(self) -> int:
        return self.cache.total_size()


ADAPTERS = {"arbor": ArborAdapter, "sglang": SglangAdapter}


# ------------------------------------------------------------------ worker


class _Slots:
    """Hands out fresh slot ranges (the allocator is not what is measured)."""

    def __init__(self) -> None:
        self.next = 1

    def take(self, n: int) -> range:
        start, self.next = self.next, self.next + n
        return range(start, self.next)


def _fill(impl: object, slots: _Slots, source: Iterator, target: int) -> None:
    while impl.size() < target:
        prompt, answer = next(source)
        tokens = prompt + answer
        impl.insert(impl.key(tokens), impl.value(slots.take(len(tokens))))


def run_case(impl_name: str, trace: str, cached: int, page_size: int) -> dict:
    """Fill, run one measured round, then time evictions; latencies in microseconds."""
    impl = ADAPTERS[impl_name](page_size)
    slots = _Slots()
    _fill(impl, slots, rounds(trace, seed=1000), cached)
    start_size = impl.size()
    match_us, insert_us = [], []
    clock = time.perf_counter_ns
    for prompt, answer in TRACES[trace](random.Random(7)):
        key = impl.key(prompt)
        t0 = clock()
        impl.match(key)
        match_us.append((clock() - t0) / 1e3)
        full = prompt + answer
        key, value = impl.key(full), impl.value(slots.take(len(full)))
        t0 = clock()
        impl.insert(key, value)
        insert_us.append((clock() - t0) / 1e3)
    refill = rounds(trace, seed=5000)
    evict_ms = []
    for _ in range(EVICT_REPEATS):
        t0 = clock()
        freed = impl.evict(EVICT_TOKENS)
        evict_ms.append((clock() - t0) / 1e6)
        assert freed >= EVICT_TOKENS, f"{impl_name} freed only {freed}"
        _fill(impl, slots, refill, impl.size() + freed)
    return {
        "impl": impl_name,
        "trace": trace,
        "cached_tokens": start_size,
        "page_size": page_size,
        "ops": len(match_us),
        "match_us": statistics.median(match_us),
        "insert_us": statistics.median(insert_us),
        "evict_10k_ms": statistics.median(evict_ms),
    }


def worker(impl_name: str, cases: list[list]) -> None:
    """Run every case in this process and print one JSON list."""
    print(json.dumps([run_case(impl_name, *case) for case in cases]))


# ------------------------------------------------------------------ parent


def _run_worker(python: str, impl_name: str, cases: list[list]) -> list[dict] | None:
    cmd = [python, __file__, "--worker", impl_name, "--cases", json.dumps(cases)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        print(f"[{impl_name}] skipped: {proc.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _chart(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = [
        ("match_us", "match_prefix (µs)"),
        ("insert_us", "insert (µs)"),
        ("evict_10k_ms", "evict 10k tokens (ms)"),
    ]
    labels = [f"{r['trace']}\n{r['cached_label']} p{r['page_size']}" for r in rows]
    fig, axes = plt.subplots(len(metrics), 1, figsize=(13, 10))
    x = range(len(rows))
    for ax, (field, title) in zip(axes, metrics):
        ax.bar([i - 0.2 for i in x], [r["arbor"][field] for r in rows], 0.4, label="Arbor")
        if all(r.get("sglang") for r in rows):
            ax.bar([i + 0.2 for i in x], [r["sglang"][field] for r in rows], 0.4, label="SGLang")
        ax.set_title(f"median {title}, lower is better")
        ax.set_xticks(list(x), labels, fontsize=7)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peer-python", default=sys.executable, help="interpreter that can import sglang")
    parser.add_argument("--quick", action="store_true", help="only 100k tokens, page size 1")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--cases", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, json.loads(args.cases))
        return
    sizes = [100_000] if args.quick else [100_000, 1_000_000]
    pages = [1] if args.quick else [1, 16]
    cases = [[t, s, p] for s in sizes for p in pages for t in TRACES]
    arbor = _run_worker(sys.executable, "arbor", cases)
    peer = _run_worker(args.peer_python, "sglang", cases)
    if arbor is None:
        raise SystemExit("the Arbor worker failed")
    rows = []
    header = f"{'trace':<10} {'cached':>7} {'page':>4} | {'match µs':>17} | {'insert µs':>17} | {'evict 10k ms':>18}"
    print(header + "\n" + "-" * len(header))
    for i, case in enumerate(cases):
        ours, theirs = arbor[i], peer[i] if peer else None
        row = {
            "trace": case[0],
            "cached_label": f"{case[1] // 1000}k",
            "page_size": case[2],
            "arbor": ours,
            "sglang": theirs,
        }
        rows.append(row)
        cells = []
        for field in ("match_us", "insert_us", "evict_10k_ms"):
            if theirs:
                row[f"{field}_speedup"] = theirs[field] / ours[field]
                cells.append(f"{ours[field]:6.2f} {theirs[field]:6.2f} {row[f'{field}_speedup']:4.1f}x")
            else:
                cells.append(f"{ours[field]:6.2f}")
        print(f"{case[0]:<10} {row['cached_label']:>7} {case[2]:>4} | " + " | ".join(f"{c:>17}" for c in cells))
    print("cells: Arbor, SGLang, SGLang/Arbor (medians; higher ratio = Arbor faster)")
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    meta = {"python": sys.version.split()[0], "peer": "sglang" if peer else None, "evict_tokens": EVICT_TOKENS}
    (OUT_DIR / "bench_radix.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    _chart(rows, OUT_DIR / "bench_radix.png")
    print(f"wrote {OUT_DIR / 'bench_radix.json'} and bench_radix.png")


if __name__ == "__main__":
    main()
