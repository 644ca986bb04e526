"""Constrained decoding, per grammar backend: compile coverage and time, per-token mask
cost, validity, end-to-end speed.

Side by side in one run, on the same schemas and the same vocabulary (GPT-2's), for each of
Arbor's backends (--grammar-backend outlines | xgrammar | llguidance):
- JSONSchemaBench sample (../shared/data/jsonschemabench): fraction compiled within the time
  limit by Arbor's compile service, compile time p50/p90, random walks (random logits at
  temperature 1) that end, and of those the fraction that validate (jsonschema with its format
  checker), and the sample's valid instances the backend accepts. Peer: plain outlines-core
  (its own schema->regex + Index) in a child process with the same time and memory limits.
- Per-token mask cost along the same token sequences: each backend's `fill_bitmask`, and
  outlines-core's `Guide.write_mask_into` on Arbor's own index.
- End to end with the Engine: JSON-schema generation with jump-forward for each backend (and
  outlines without it), and unconstrained generation of the same lengths (ignore_eos).
Table on stdout; JSON + PNG into docs/benchmarks/.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "benchmarks"
BENCH = ROOT / ".." / "shared" / "data" / "jsonschemabench"
sys.path.insert(0, str(ROOT))

import peers  # noqa: E402

from arbor.grammar.compiler import GrammarError  # noqa: E402
from arbor.grammar.constraint import constraint_from_params  # noqa: E402
from arbor.runtime.tiny_model import TinySpec, builtin_model_path, make_tiny_model  # noqa: E402
from tests.grammar.random_walk import Family  # noqa: E402
from tests.grammar.schemas import SCHEMAS  # noqa: E402

BACKENDS = ("outlines", "xgrammar", "llguidance")
PEER_CHILD = r"""
import json, sys, time, resource
limit = int(sys.argv[2]) << 20
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
schema = json.load(open(sys.argv[1]))["schema"]
import outlines_core
from outlines_core.json_schema import build_regex_from_schema
voc = outlines_core.Vocabulary.from_binary(open(sys.argv[3], "rb").read())
t = time.perf_counter()
outlines_core.Index(build_regex_from_schema(json.dumps(schema)), voc)
print(json.dumps({"s": time.perf_counter() - t}))
"""


def peer_compile(path: Path, timeout: float, memory_mb: int, vocab_file: str) -> float | None:
    """Plain outlines-core's compile time of one schema, in a child process; None if it
    failed or timed out."""
    try:
        run = subprocess.run(
            [sys.executable, "-c", PEER_CHILD, str(path), str(memory_mb), vocab_file],
            capture_output=True,
            text=True,
            timeout=timeout + 15,
        )
    except subprocess.TimeoutExpired:
        return None
    if run.returncode != 0 or not run.stdout.strip():
        return None
    seconds = json.loads(run.stdout.strip().splitlines()[-1])["s"]
    return seconds if seconds <= timeout else None


def canonical(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def coverage(
    families: dict[str, Family], files: list[Path], timeout: float, peer: bool, vocab_file: str, walks: int
) -> dict[str, Any]:
    """JSONSchemaBench per backend: compile rate and time, output validity, instance acceptance."""
    import jsonschema

    rows = []
    for i, path in enumerate(files):
        data = json.loads(path.read_text())
        schema = data["schema"]
        row: dict[str, Any] = {"schema": path.name}
        try:
            validator = jsonschema.validators.validator_for(schema)(schema, format_checker=jsonschema.FormatChecker())
        except jsonschema.exceptions.SchemaError:
            validator = None
        valid = [t["data"] for t in data.get("tests", []) if t.get("valid")]
        for backend, family in families.items():
            row[backend] = _one_backend(family, backend, schema, validator, valid, walks)
        if peer:
            row["outlines_core_s"] = peer_compile(path, timeout, 4096, vocab_file)
        rows.append(row)
        print(f"\r  coverage {i + 1}/{len(files)}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    summary: dict[str, Any] = {"schemas": len(rows)}
    for backend in families:
        cells = [r[backend] for r in rows]
        times = [c["s"] for c in cells if c["s"] is not None]
        done = [c for c in cells if c["s"] is not None]
        ended = sum(c["ended"] for c in done)
        n_inst = sum(c["instances"] for c in done)
        summary[backend] = {
            "compiled": len(times) / len(rows),
            **_pcts(times),
            "walks_ended": ended / max(walks * len(done), 1),
            "valid_outputs": sum(c["valid"] for c in done) / max(ended, 1),
            "instances_accepted": sum(c["accepted"] for c in done) / max(n_inst, 1),
        }
    if peer:
        times = [r["outlines_core_s"] for r in rows if r.get("outlines_core_s") is not None]
        summary["outlines_core"] = {"compiled": len(times) / len(rows), **_pcts(times)}
    return {"summary": summary, "rows": rows}


def _one_backend(
    family: Family, backend: str, schema: Any, validator: Any, valid: list[Any], walks: int
) -> dict[str, Any]:
    """Compile one schema on one backend; walk it; feed it the sample's valid instances."""
    import jsonschema

    cell: dict[str, Any] = {"s": None, "ended": 0, "valid": 0, "instances": len(valid), "accepted": 0}
    params = {"json_schema": schema}
    start = time.perf_counter()
    try:
        grammar = family.compiler.compile(constraint_from_params(dict(params), backend))
    except (ValueError, GrammarError) as exc:
        cell["error"] = str(exc)[:120]
        return cell
    cell["s"] = time.perf_counter() - start
    for seed in range(walks):
        text, done, _ = family.walk(params, seed, max_tokens=2000)
        if done:
            cell["ended"] += 1
            with contextlib.suppress(json.JSONDecodeError, jsonschema.exceptions.SchemaError):
                cell["valid"] += validator is not None and validator.is_valid(json.loads(text))
    for inst in valid:
        m = grammar.matcher()
        cell["accepted"] += m.accept_tokens(family.retok.encode(canonical(inst).encode())) and m.allows_end()
    return cell


def _pcts(xs: list[float]) -> dict[str, float | None]:
    if not xs:
        return {"p50_s": None, "p90_s": None}
    q = np.percentile(xs, [50, 90])
    return {"p50_s": float(q[0]), "p90_s": float(q[1])}


def mask_cost(families: dict[str, Family], walks: int) -> dict[str, Any]:
    """Per-token mask time along identical token sequences, per backend (µs)."""
    import outlines_core

    out: dict[str, list[float]] = {
        "outlines": [],
        "outlines_warm": [],
        "outlines_core": [],
        "xgrammar": [],
        "llguidance": [],
    }
    base = families["outlines"]
    voc = base.vocab.outlines()
    row = np.zeros(-(-base.vocab.logits_size // 32), dtype=np.int32)
    for _, schema in sorted(SCHEMAS.items()):
        params = {"json_schema": schema}
        grammars = {}
        for backend, family in families.items():
            with contextlib.suppress(ValueError, GrammarError):
                grammars[backend] = family.compiler.compile(constraint_from_params(dict(params), backend))
        if "outlines" not in grammars:
            continue
        for seed in range(walks):
            ids = _walk_ids(base, params, seed)
            labels = [
                ("outlines", "outlines"),
                ("outlines", "outlines_warm"),
                ("xgrammar", "xgrammar"),
                ("llguidance", "llguidance"),
            ]  # outlines twice: first visits build masks, then hits
            for backend, label in labels:
                if backend in grammars:
                    _time_masks(grammars[backend].matcher(), ids, row, out[label])
            guide = outlines_core.Guide(grammars["outlines"].index)  # the same automaton: only the mask op differs
            buf = np.zeros(-(-len(voc) // 32) + 1, dtype=np.int32)
            for tok in ids:
                t = time.perf_counter_ns()
                guide.write_mask_into(buf.ctypes.data, buf.size, 4)
                out["outlines_core"].append((time.perf_counter_ns() - t) / 1e3)
                guide.advance(tok)
    return {k: _us(v) for k, v in out.items() if v}


def _time_masks(matcher: Any, ids: list[int], row: np.ndarray, into: list[float]) -> None:
    for tok in ids:
        t = time.perf_counter_ns()
        matcher.fill_bitmask(row)
        into.append((time.perf_counter_ns() - t) / 1e3)
        if not matcher.accept_token(tok):  # another backend's language may differ (number lengths)
            return


def _us(xs: list[float]) -> dict[str, float]:
    return {
        "tokens": len(xs),
        "mean_us": float(np.mean(xs)),
        "p50_us": float(np.percentile(xs, 50)),
        "p99_us": float(np.percentile(xs, 99)),
    }


def _walk_ids(family: Family, params: dict, seed: int) -> list[int]:
    text, _, _ = family.walk(params, seed, max_tokens=600)
    return family.retok.encode(text.encode())


def common_schemas(families: dict[str, Family]) -> list[str]:
    """The hand-written schemas every backend compiles (xgrammar refuses a `false` subschema)."""
    names = []
    for name, schema in sorted(SCHEMAS.items()):
        try:
            for backend, family in families.items():
                family.compiler.compile(constraint_from_params({"json_schema": schema}, backend))
        except (ValueError, GrammarError):
            continue
        names.append(name)
    return names


def end_to_end(requests: int, names: list[str], dtype: str) -> dict[str, Any]:
    """Engine tokens/s: constrained on each backend (jump-forward on; outlines also off), each
    beside unconstrained generation of the same per-request lengths (ignore_eos), over the
    schemas `names`. Backends write outputs of different lengths (outlines caps a number at
    16 digits and closes on a budget; the others do not), so each has its own baseline."""
    model = Path(tempfile.gettempdir()) / "arbor-bench-grammar-model"
    if not (model / "config.json").exists():
        make_tiny_model(model, TinySpec(arch="llama", layers=8, hidden=512, heads=8, kv_heads=4))
    params = [
        {"json_schema": SCHEMAS[names[i % len(names)]], "temperature": 1.0, "seed": i, "max_new_tokens": 400}
        for i in range(requests)
    ]
    prompts = [f"Reply in JSON ({i}):" for i in range(requests)]
    distinct = min(len(names), requests)
    result: dict[str, Any] = {}
    runs = [(b, {"grammar_backend": b}) for b in BACKENDS] + [("outlines_no_jump", {"disable_jump_forward": True})]
    for label, server_args in runs:
        print(f"  {label}", file=sys.stderr)
        run, lengths = _timed_run(model, prompts, params, distinct, dtype=dtype, **server_args)
        free = [{"temperature": 1.0, "seed": i, "max_new_tokens": n, "ignore_eos": True} for i, n in enumerate(lengths)]
        run["free_tok_s"] = _timed_run(model, prompts, free, 4, dtype=dtype)[0]["tok_s"]
        result[label] = run
    return result


def _timed_run(
    model: Path, prompts: list[str], params: list[dict], warm: int, **server_args: Any
) -> tuple[dict[str, Any], list[int]]:
    """One Engine run after `warm` warm-up requests (which compile their grammars):
    (summary, per-request completion lengths)."""
    from arbor.runtime.engine import Engine

    with Engine(str(model), max_running_requests=64, **server_args) as e:
        e.generate(prompts[:warm], sampling_params=params[:warm])
        before = e.stats()
        t = time.perf_counter()
        outs = e.generate(prompts, sampling_params=params)
        wall = time.perf_counter() - t
        after = e.stats()
    lengths = [o["meta_info"]["completion_tokens"] for o in outs]
    tokens = sum(lengths)
    return {
        "tokens": tokens,
        "seconds": wall,
        "tok_s": tokens / wall,
        "forced_share": (after["forced_tokens"] - before["forced_tokens"]) / tokens,
        "decode_steps": after["decode_steps"] - before["decode_steps"],
    }, lengths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, default=0, help="use every k-th JSONSchemaBench schema (0 = all)")
    parser.add_argument("--timeout", type=float, default=10.0, help="compile time limit per schema, seconds")
    parser.add_argument("--walks", type=int, default=3, help="random walks per schema (coverage and mask timing)")
    parser.add_argument("--requests", type=int, default=96, help="end-to-end requests")
    parser.add_argument("--no-peers", action="store_true", help="skip the plain outlines-core compile runs")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from arbor.grammar.compiler import CompilerConfig, GrammarCompiler

    tokenizer = AutoTokenizer.from_pretrained(str(builtin_model_path()))
    families = {b: Family(tokenizer, b) for b in BACKENDS}
    for backend, family in families.items():  # one worker each, the bench's time limit
        family.compiler.close()
        family.compiler = GrammarCompiler(
            family.vocab,
            CompilerConfig(backend=backend, workers=1, timeout_s=args.timeout),
            encode=lambda text: tokenizer.encode(text, add_special_tokens=False),
        )
    files = sorted(BENCH.glob("*.json"))
    if args.sample:
        files = files[:: args.sample]
    with tempfile.NamedTemporaryFile(suffix=".vocab") as vf:
        vf.write(families["outlines"].vocab.outlines().__reduce__()[1][0])
        vf.flush()
        result: dict[str, Any] = {
            "coverage": coverage(families, files, args.timeout, not args.no_peers, vf.name, args.walks)
        }
    print("mask timing", file=sys.stderr)
    result["mask"] = mask_cost(families, args.walks)
    names = common_schemas(families)
    for family in families.values():
        family.close()
    print("end to end", file=sys.stderr)
    result["dtype"] = peers.dtype_name()
    result["end_to_end"] = end_to_end(args.requests, names, result["dtype"])
    result["end_to_end_schemas"] = len(names)
    report(result)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "bench_grammar.json").write_text(json.dumps(result, indent=2))
    chart(result)


def _fmt(x: float | None, scale: float = 1.0, digits: int = 2) -> str:
    return "-" if x is None else f"{x * scale:.{digits}f}"


def report(r: dict[str, Any]) -> None:
    s = r["coverage"]["summary"]
    print(f"\nJSONSchemaBench sample: {s['schemas']} schemas, compile limit per schema as given")
    print(
        f"{'system':<14} {'compiled':>9} {'p50 s':>8} {'p90 s':>8} {'walks ended':>12} {'valid':>7} {'instances':>10}"
    )
    for system in (*BACKENDS, "outlines_core"):
        if system not in s:
            continue
        v = s[system]
        tail = (
            (
                f"{v['walks_ended'] * 100:>11.1f}% {v['valid_outputs'] * 100:>6.1f}% "
                f"{v['instances_accepted'] * 100:>9.1f}%"
            )
            if "walks_ended" in v
            else ""
        )
        print(
            f"{system:<14} {v['compiled'] * 100:>8.1f}% {_fmt(v['p50_s'], digits=3):>8} "
            f"{_fmt(v['p90_s'], digits=3):>8} {tail}"
        )
    print(f"\nper-token mask cost (µs) along the same token sequences, {len(SCHEMAS)} hand-written schemas")
    print(f"{'system':<14} {'tokens':>7} {'mean':>8} {'p50':>8} {'p99':>8}")
    for system, v in r["mask"].items():
        print(f"{system:<14} {v['tokens']:>7} {v['mean_us']:>8.2f} {v['p50_us']:>8.2f} {v['p99_us']:>8.2f}")
    print(
        f"\nend to end (Engine, 8-layer tiny Llama, {r['dtype']}, temperature 1.0, {r['end_to_end_schemas']} "
        "schemas every backend compiles; free = unconstrained, same per-request lengths)"
    )
    print(
        f"{'run':<18} {'tokens':>7} {'s':>7} {'tok/s':>8} {'free tok/s':>11} {'ratio':>7} {'forced':>7} "
        f"{'decode steps':>13}"
    )
    for run, v in r["end_to_end"].items():
        print(
            f"{run:<18} {v['tokens']:>7} {v['seconds']:>7.2f} {v['tok_s']:>8.1f} {v['free_tok_s']:>11.1f} "
            f"{v['tok_s'] / v['free_tok_s']:>6.2f}x {v['forced_share'] * 100:>6.1f}% {v['decode_steps']:>13}"
        )


def chart(r: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    s = r["coverage"]["summary"]
    systems = [k for k in (*BACKENDS, "outlines_core") if k in s]
    axes[0].bar(systems, [s[k]["compiled"] * 100 for k in systems], color="tab:green")
    axes[0].set_ylabel("% compiled within the limit")
    axes[0].set_title("JSONSchemaBench sample")
    mask = r["mask"]
    xs = np.arange(len(mask))
    axes[1].bar(xs - 0.2, [v["mean_us"] for v in mask.values()], 0.4, label="mean", color="tab:blue")
    axes[1].bar(xs + 0.2, [v["p99_us"] for v in mask.values()], 0.4, label="p99", color="tab:orange")
    axes[1].set_xticks(xs, list(mask), rotation=30, ha="right", fontsize=7)
    axes[1].set_yscale("log")
    axes[1].set_ylabel("µs per token")
    axes[1].set_title("mask cost")
    axes[1].legend(fontsize=7)
    e = r["end_to_end"]
    xs = np.arange(len(e))
    axes[2].bar(xs - 0.2, [v["tok_s"] for v in e.values()], 0.4, label="constrained", color="tab:purple")
    axes[2].bar(xs + 0.2, [v["free_tok_s"] for v in e.values()], 0.4, label="free, same lengths", color="tab:gray")
    axes[2].set_xticks(xs, list(e), rotation=30, ha="right", fontsize=7)
    axes[2].legend(fontsize=7)
    axes[2].set_ylabel("output tokens/s")
    axes[2].set_title(f"end to end ({r['dtype']})")
    fig.tight_layout()
    fig.savefig(OUT / "bench_grammar.png", dpi=110)


if __name__ == "__main__":
    main()
