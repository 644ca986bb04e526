"""Two revisions of Arbor, interleaved: `bench_offline.py --sections peers --systems arbor` and
`profile_step.py`, run round by round on the old tree and the new one (the order flips each round), so
machine noise hits both.

Each revision runs from its own git worktree (`git worktree add`, under a temporary folder)
with that tree first on PYTHONPATH as `arbor`, so the child processes it spawns import the same
code (the working tree is never written to: its committed JSON stays as it is). Per round, each
side writes its JSON into its own tree; this script collects the numbers and prints medians
over rounds with after/before ratios. JSON + PNG into docs/benchmarks/before_after.*.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "benchmarks"
WORKLOADS = ("W1", "W2", "chat")


def checkout(rev: str, base: Path) -> Path:
    """A worktree of `rev` reachable as the package `arbor`: base/rev/arbor -> the tree."""
    tree = base / f"tree-{rev.replace('/', '_')}"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(tree), rev], check=True, capture_output=True
    )
    link = base / f"path-{rev.replace('/', '_')}" / "arbor"
    link.parent.mkdir()
    link.symlink_to(tree)
    return link


def env_of(tree: Path) -> dict[str, str]:
    """`tree` first on the path as `arbor`, with its own C++ kernel build folder: torch rebuilds
    an extension whose sources moved, so two trees sharing one folder would rebuild each round."""
    return os.environ | {"PYTHONPATH": str(tree.parent), "TORCH_EXTENSIONS_DIR": str(tree.parent / "torch_ext")}


def build_kernels(tree: Path) -> None:
    """Build the tree's C++ kernels before anything is timed."""
    code = "from arbor.kernels.cpu_ops import load; assert load() is not None"
    subprocess.run([sys.executable, "-c", code], check=True, env=env_of(tree), cwd=tree.parent)


def run(tree: Path, script: str, args: list[str]) -> None:
    """Run one benchmark script of `tree` with that tree imported as `arbor`."""
    env = env_of(tree)
    cmd = [sys.executable, str(tree / "benchmarks" / script), *args]
    print(f"$ PYTHONPATH={tree.parent} {' '.join(cmd)}", flush=True)
    subprocess.run(cmd, check=True, env=env, cwd=tree)


def offline_numbers(tree: Path) -> dict[str, float]:
    peers = json.loads((tree / "docs" / "benchmarks" / "bench_offline.json").read_text())["peers"]
    arbor = peers["systems"]["arbor"]
    return {f"{w} tok/s": arbor[w]["tok_s"] for w in WORKLOADS if w in arbor}


def profile_numbers(tree: Path) -> dict[str, float]:
    cells = json.loads((tree / "docs" / "benchmarks" / "profile_before_after.json").read_text())["cells"]
    return {f"{c['kind']} b{c['batch']} ms": c["parts"]["step"] for c in cells}


def measure(tree: Path, repeats: int, batches: str) -> dict[str, float]:
    run(tree, "bench_offline.py", ["--sections", "peers", "--systems", "arbor", "--repeats", str(repeats)])
    run(tree, "profile_step.py", ["--batches", batches, "--save", "before_after"])
    return offline_numbers(tree) | profile_numbers(tree)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="git revision of the 'before' side")
    ap.add_argument("--after", default="HEAD", help="git revision of the 'after' side")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds (before, after, before, after, ...)")
    ap.add_argument("--repeats", type=int, default=3, help="bench_offline repeats per workload in each round")
    ap.add_argument("--batches", default="1,16,64", help="profile_step batch sizes")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        sides = {"before": checkout(args.before, base), "after": checkout(args.after, base)}
        rows: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
        try:
            for tree in sides.values():
                build_kernels(tree)
            for i in range(args.rounds):
                order = list(sides.items()) if i % 2 == 0 else list(sides.items())[::-1]  # no side always goes first
                for side, tree in order:
                    print(f"\n== round {i + 1}/{args.rounds}: {side}", flush=True)
                    for key, value in measure(tree, args.repeats, args.batches).items():
                        rows[side].setdefault(key, []).append(value)
        finally:
            for tree in sides.values():
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree.resolve())],
                    check=False,
                    capture_output=True,
                )
    result = {"before": args.before, "after": args.after, "rounds": args.rounds, "runs": rows}
    report(result)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "before_after.json").write_text(json.dumps(result, indent=2))
    chart(result, OUT / "before_after.png")


def medians(result: dict[str, Any]) -> list[tuple[str, float, float]]:
    runs = result["runs"]
    return [
        (key, statistics.median(runs["before"][key]), statistics.median(runs["after"][key]))
        for key in runs["before"]
        if key in runs["after"]
    ]


def report(result: dict[str, Any]) -> None:
    print(f"\nbefore = {result['before']}, after = {result['after']}, median of {result['rounds']} interleaved rounds")
    print(f"{'measure':>22} {'before':>10} {'after':>10} {'after/before':>13}")
    for key, before, after in medians(result):
        print(f"{key:>22} {before:>10.1f} {after:>10.1f} {after / before:>13.3f}")


def chart(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = medians(result)
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.barh([k for k, _, _ in rows], [a / b for _, b, a in rows], color="#4c72b0")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("after / before (tok/s: higher is faster; ms: lower is faster)")
    ax.set_title(f"{result['before']} -> {result['after']}, median of {result['rounds']} interleaved rounds")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
