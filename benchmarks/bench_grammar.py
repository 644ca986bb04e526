"""Constrained decoding: compile coverage and time, per-token mask cost, end-to-end speed.

Side by side in one run, on the same schemas and the same vocabulary (GPT-2's):
- JSONSchemaBench sample (../shared/data/jsonschemabench): fraction compiled within the time
  limit, compile time p50/p90, fraction of generated outputs (random walks) that validate,
  fraction of the sample's valid instances the token FSM accepts; for Arbor, plain
  outlines-core (its own schema->regex + Index) and xgrammar (if installed). Peers compile
  each schema in a child process with the same time and memory limits.
- Per-token mask cost along the same token sequences: Arbor's cached bitsets vs
  outlines-core `Guide.write_mask_into` vs xgrammar `fill_next_token_bitmask`.
- End-to-end with the Engine: JSON-schema generation with jump-forward on and off, and
  unconstrained generation of the same lengths (ignore_eos), tokens/s and forced share.
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

from arbor.grammar.compiler import CompilerConfig, GrammarCompiler  # noqa: E402
from arbor.grammar.constraint import constraint_from_params  # noqa: E402
from arbor.grammar.jump_forward import Retokenizer  # noqa: E402
from arbor.grammar.matcher import GrammarMatcher  # noqa: E402
from arbor.runtime.tiny_model import TinySpec, builtin_model_path, make_tiny_model  # noqa: E402
from tests.grammar.random_walk import Family  # noqa: E402
from tests.grammar.schemas import SCHEMAS  # noqa: E402

PEER_CHILD = r"""
import json, sys, time, resource
limit = int(sys.argv[3]) << 20
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
schema = json.load(open(sys.argv[2]))["schema"]
if sys.argv[1] == "outlines":
    import outlines_core
    from outlines_core.json_schema import build_regex_from_schema
    voc = outlines_core.Vocabulary.from_binary(open(sys.argv[4], "rb").read())
    t = time.perf_counter()
    outlines_core.Index(build_regex_from_schema(json.dumps(schema)), voc)
else:
    import xgrammar
    from transformers import AutoTokenizer
    info = xgrammar.TokenizerInfo.from_huggingface(AutoTokenizer.from_pretrained(sys.argv[4]))
    compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    t = time.perf_counter()
    compiler.compile_json_schema(json.dumps(schema))
print(json.dumps({"s": time.perf_counter() - t}))
"""


def peer_compile(kind: str, path: Path, timeout: float, memory_mb: int, resource_arg: str) -> float | None:
    """Compile time of one schema by a peer in a child process; None if it failed or timed out."""
    try:
        run = subprocess.run([sys.executable, "-c", PEER_CHILD, kind, str(path), str(memory_mb), resource_arg],
                             capture_output=True, text=True, timeout=timeout + 15)
    except subprocess.TimeoutExpired:
        return None
    if run.returncode != 0 or not run.stdout.strip():
        return None
    seconds = json.loads(run.stdout.strip().splitlines()[-1])["s"]
    return seconds if seconds <= timeout else None


def has_xgrammar() -> bool:
    try:
        import xgrammar  # noqa: F401
    except ImportError:
        return False
    return True


def canonical(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def coverage(family: Family, files: list[Path], timeout: float, peers: list[str], vocab_file: str,
             model_dir: str, walks: int) -> dict[str, Any]:
    """JSONSchemaBench: compile rate and time, output validity, instance acceptance."""
    import jsonschema

    rows = []
    for i, path in enumerate(files):
        data = json.loads(path.read_text())
        row: dict[str, Any] = {"schema": path.name}
        start = time.perf_counter()
        try:
            grammar = family.compiler.compile(constraint_from_params({"json_schema": data["schema"]}))
            row["arbor_s"] = time.perf_counter() - start
        except ValueError as exc:
            grammar, row["arbor_s"], row["arbor_error"] = None, None, str(exc)[:120]
        if grammar is not None:
            validator = jsonschema.validators.validator_for(data["schema"])(data["schema"])
            ended = valid_out = 0
            for seed in range(walks):
                text, done, _ = family.walk({"json_schema": data["schema"]}, seed, max_tokens=2000)
                if done:
                    ended += 1
                    with contextlib.suppress(json.JSONDecodeError, jsonschema.exceptions.SchemaError):
                        valid_out += validator.is_valid(json.loads(text))
            row["walks_ended"], row["walks_valid"] = ended, valid_out
            valid = [t["data"] for t in data.get("tests", []) if t.get("valid")]
            accepted = 0
            for inst in valid:
                m = GrammarMatcher(grammar)
                accepted += m.accept_tokens(family.retok.encode(canonical(inst).encode())) and m.allows_end()
            row["instances"], row["accepted"] = len(valid), accepted
        for peer in peers:
            row[f"{peer}_s"] = peer_compile(peer, path, timeout, 4096, vocab_file if peer == "outlines" else model_dir)
        rows.append(row)
        print(f"\r  coverage {i + 1}/{len(files)}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    summary: dict[str, Any] = {"schemas": len(rows)}
    for system in ["arbor", *peers]:
        times = [r[f"{system}_s"] for r in rows if r.get(f"{system}_s") is not None]
        summary[system] = {"compiled": len(times) / len(rows), **_pcts(times)}
    compiled = [r for r in rows if r.get("arbor_s") is not None]
    ended = sum(r["walks_ended"] for r in compiled)
    summary["arbor"]["walks_ended"] = ended / max(walks * len(compiled), 1)
    summary["arbor"]["valid_outputs"] = sum(r["walks_valid"] for r in compiled) / max(ended, 1)
    n_inst = sum(r["instances"] for r in compiled)
    summary["arbor"]["instances_accepted"] = sum(r["accepted"] for r in compiled) / max(n_inst, 1)
    return {"summary": summary, "rows": rows}


def _pcts(xs: list[float]) -> dict[str, float | None]:
    if not xs:
        return {"p50_s": None, "p90_s": None}
    q = np.percentile(xs, [50, 90])
    return {"p50_s": float(q[0]), "p90_s": float(q[1])}


def mask_cost(family: Family, walks: int) -> dict[str, Any]:
    """Per-token mask time along identical token sequences, per system (µs)."""
    import outlines_core

    out: dict[str, list[float]] = {"arbor": [], "arbor_warm": [], "outlines": [], "xgrammar": []}
    voc = family.vocab.outlines()
    xg = _xgrammar(family) if has_xgrammar() else None
    words = -(-family.vocab.logits_size // 32)
    for _, schema in sorted(SCHEMAS.items()):
        grammar = family.compiler.compile(constraint_from_params({"json_schema": schema}))
        index = grammar.index  # the same automaton, so only the mask operation differs
        xg_grammar = None
        if xg:
            with contextlib.suppress(RuntimeError):  # xgrammar refuses some schemas (e.g. false)
                xg_grammar = xg[0].compile_json_schema(json.dumps(schema))
        for seed in range(walks):
            ids = _walk_ids(family, {"json_schema": schema}, seed)
            row = np.zeros(words, dtype=np.int32)
            for label in ("arbor", "arbor_warm"):  # first visits build masks; the second pass hits
                m = GrammarMatcher(grammar)
                for tok in ids:
                    t = time.perf_counter_ns()
                    m.fill_bitmask(row)
                    out[label].append((time.perf_counter_ns() - t) / 1e3)
                    m.accept_token(tok)
            guide = outlines_core.Guide(index)
            buf = np.zeros(-(-len(voc) // 32) + 1, dtype=np.int32)
            for tok in ids:
                t = time.perf_counter_ns()
                guide.write_mask_into(buf.ctypes.data, buf.size, 4)
                out["outlines"].append((time.perf_counter_ns() - t) / 1e3)
                guide.advance(tok)
            if xg_grammar is not None:
                import xgrammar

                matcher = xgrammar.GrammarMatcher(xg_grammar)
                bitmask = xgrammar.allocate_token_bitmask(1, xg[1].vocab_size)
                for tok in ids:
                    t = time.perf_counter_ns()
                    matcher.fill_next_token_bitmask(bitmask)
                    out["xgrammar"].append((time.perf_counter_ns() - t) / 1e3)
                    if not matcher.accept_token(tok):
                        break
    return {k: _us(v) for k, v in out.items() if v}


def _us(xs: list[float]) -> dict[str, float]:
    return {"tokens": len(xs), "mean_us": float(np.mean(xs)), "p50_us": float(np.percentile(xs, 50)),
            "p99_us": float(np.percentile(xs, 99))}


def _xgrammar(family: Family) -> tuple[Any, Any]:
    import xgrammar

    info = xgrammar.TokenizerInfo.from_huggingface(family.tokenizer, vocab_size=family.vocab.logits_size)
    return xgrammar.GrammarCompiler(info, max_threads=2), info


def _walk_ids(family: Family, params: dict, seed: int) -> list[int]:
    text, _, _ = family.walk(params, seed, max_tokens=600)
    return family.retok.encode(text.encode())


def end_to_end(requests: int) -> dict[str, Any]:
    """Engine tokens/s: constrained (jump-forward on / off) vs unconstrained, same lengths."""
    model = Path(tempfile.gettempdir()) / "arbor-bench-grammar-model"
    if not (model / "config.json").exists():
        make_tiny_model(model, TinySpec(arch="llama", layers=8, hidden=512, heads=8, kv_heads=4))
    names = sorted(SCHEMAS)
    params = [{"json_schema": SCHEMAS[names[i % len(names)]], "temperature": 1.0, "seed": i,
               "max_new_tokens": 400} for i in range(requests)]
    prompts = [f"Reply in JSON ({i}):" for i in range(requests)]
    distinct = min(len(names), requests)
    jump = _timed_run(model, prompts, params, distinct)
    result = {"jump_forward": jump[0],
              "no_jump_forward": _timed_run(model, prompts, params, distinct, disable_jump_forward=True)[0]}
    free = [{"temperature": 1.0, "seed": i, "max_new_tokens": n, "ignore_eos": True} for i, n in enumerate(jump[1])]
    result["unconstrained"] = _timed_run(model, prompts, free, 4)[0]
    return result


def _timed_run(model: Path, prompts: list[str], params: list[dict], warm: int, **server_args: Any
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
    return {"tokens": tokens, "seconds": wall, "tok_s": tokens / wall,
            "forced_share": (after["forced_tokens"] - before["forced_tokens"]) / tokens,
            "decode_steps": after["decode_steps"] - before["decode_steps"]}, lengths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, default=0, help="use every k-th JSONSchemaBench schema (0 = all)")
    parser.add_argument("--timeout", type=float, default=10.0, help="compile time limit per schema, seconds")
    parser.add_argument("--walks", type=int, default=3, help="random walks per schema (coverage and mask timing)")
    parser.add_argument("--requests", type=int, default=96, help="end-to-end requests")
    parser.add_argument("--no-peers", action="store_true", help="skip the outlines-core / xgrammar compile runs")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    model_dir = str(builtin_model_path())
    family = Family(AutoTokenizer.from_pretrained(model_dir))
    family.compiler.close()
    family.compiler = GrammarCompiler(family.vocab, CompilerConfig(workers=1, timeout_s=args.timeout))
    family.retok = Retokenizer(family.tokenizer, family.vocab)
    files = sorted(BENCH.glob("*.json"))
    if args.sample:
        files = files[:: args.sample]
    peers = [] if args.no_peers else ["outlines", *(["xgrammar"] if has_xgrammar() else [])]
    with tempfile.NamedTemporaryFile(suffix=".vocab") as vf:
        vf.write(family.vocab.outlines().__reduce__()[1][0])
        vf.flush()
        result: dict[str, Any] = {"coverage": coverage(family, files, args.timeout, peers, vf.name, model_dir,
                                                             args.walks)}
    print("mask timing", file=sys.stderr)
    result["mask"] = mask_cost(family, args.walks)
    print("end to end", file=sys.stderr)
    result["end_to_end"] = end_to_end(args.requests)
    family.compiler.close()
    report(result)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "bench_grammar.json").write_text(json.dumps(result, indent=2))
    chart(result)


def _fmt(x: float | None, scale: float = 1.0, digits: int = 2) -> str:
    return "-" if x is None else f"{x * scale:.{digits}f}"


def report(r: dict[str, Any]) -> None:
    s = r["coverage"]["summary"]
    print(f"\nJSONSchemaBench sample: {s['schemas']} schemas, compile limit per schema as given")
    print(f"{'system':<10} {'compiled':>9} {'p50 s':>8} {'p90 s':>8}")
    for system in ("arbor", "outlines", "xgrammar"):
        if system in s:
            v = s[system]
            print(f"{system:<10} {v['compiled'] * 100:>8.1f}% {_fmt(v['p50_s'], digits=3):>8} {_fmt(v['p90_s'], digits=3):>8}")
    a = s["arbor"]
    print(f"arbor: random walks that ended within 2,000 tokens {a['walks_ended'] * 100:.1f}%, of those valid "
          f"{a['valid_outputs'] * 100:.1f}%, "
          f"valid test instances accepted {a['instances_accepted'] * 100:.1f}%")
    print(f"\nper-token mask cost (µs) along the same token sequences, {len(SCHEMAS)} hand-written schemas")
    print(f"{'system':<10} {'tokens':>7} {'mean':>8} {'p50':>8} {'p99':>8}")
    for system, v in r["mask"].items():
        print(f"{system:<10} {v['tokens']:>7} {v['mean_us']:>8.2f} {v['p50_us']:>8.2f} {v['p99_us']:>8.2f}")
    print("\nend to end (Engine, 8-layer tiny Llama, temperature 1.0)")
    print(f"{'run':<16} {'tokens':>7} {'s':>7} {'tok/s':>8} {'forced':>7} {'decode steps':>13}")
    for run, v in r["end_to_end"].items():
        print(f"{run:<16} {v['tokens']:>7} {v['seconds']:>7.2f} {v['tok_s']:>8.1f} {v['forced_share'] * 100:>6.1f}% "
              f"{v['decode_steps']:>13}")
    e = r["end_to_end"]
    print(f"constrained+jump / unconstrained: {e['jump_forward']['tok_s'] / e['unconstrained']['tok_s']:.2f}x; "
          f"jump on / off: {e['jump_forward']['tok_s'] / e['no_jump_forward']['tok_s']:.2f}x")


def chart(r: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    s = r["coverage"]["summary"]
    systems = [k for k in ("arbor", "outlines", "xgrammar") if k in s]
    axes[0].bar(systems, [s[k]["compiled"] * 100 for k in systems], color="tab:green")
    axes[0].set_ylabel("% compiled within the limit")
    axes[0].set_title("JSONSchemaBench sample")
    mask = r["mask"]
    xs = list(mask)
    axes[1].bar([x + "\nmean" for x in xs], [mask[x]["mean_us"] for x in xs], color="tab:blue")
    axes[1].bar([x + "\np99" for x in xs], [mask[x]["p99_us"] for x in xs], color="tab:orange")
    axes[1].set_yscale("log")
    axes[1].set_ylabel("µs per token")
    axes[1].set_title("mask cost")
    e = r["end_to_end"]
    axes[2].bar(list(e), [v["tok_s"] for v in e.values()], color="tab:purple")
    axes[2].set_ylabel("output tokens/s")
    axes[2].set_title("end to end")
    fig.tight_layout()
    fig.savefig(OUT / "bench_grammar.png", dpi=110)


if __name__ == "__main__":
    main()
