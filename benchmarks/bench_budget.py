"""Budget-aware constrained decoding on and off: how many JSON outputs parse and validate when
max_new_tokens is a small multiple of each schema's minimum.

JSONSchemaBench sample schemas whose keywords are all enforced during decoding (every k-th
of them), 10 seeds each at temperature 1 on the built-in tiny checkpoint (random weights: the
worst case for closing a structure), budgets of 1x, 2x and 4x the schema's minimum (which the
refusal of a 1-token budget names), and a fixed 128 tokens. Schemas needing over 128 tokens are
left out. Validity with `jsonschema` and
its format checker. Table on stdout; JSON + PNG into docs/benchmarks/.

    .venv/bin/python benchmarks/bench_budget.py [--every 4] [--seeds 10]
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path
from typing import Any

import jsonschema
from peers import dtype_name

from arbor.grammar.json_schema import schema_to_regex
from arbor.runtime.engine import Engine
from arbor.runtime.io.tokenizer_manager import RequestRefused
from arbor.runtime.tiny_model import builtin_model_path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "benchmarks"
BENCH = ROOT / ".." / "shared" / "data" / "jsonschemabench"
BUDGETS = ("1x", "2x", "4x", "128")
MAX_MINIMUM = 128  # schemas needing more are left out (4x must fit the 2,048-token context)


def enforced_schemas(every: int) -> list[dict]:
    out = []
    for path in sorted(BENCH.glob("*.json"))[::every]:
        schema = json.loads(path.read_text())["schema"]
        try:
            if not schema_to_regex(schema).unenforced:
                out.append(schema)
        except ValueError:
            continue
    return out


def minimum(engine: Engine, schema: dict) -> int | None:
    """The fewest tokens the schema needs (None: it does not compile in time)."""
    try:
        engine.generate("x", sampling_params={"json_schema": schema, "max_new_tokens": 1}, progress=False)
        return 1
    except RequestRefused as e:
        found = re.search(r"below the (\d+) tokens", str(e))
        return int(found.group(1)) if found else None


def run(engine: Engine, schemas: list[tuple[dict, int]], budget: str, aware: bool, seeds: int) -> dict[str, Any]:
    params = [
        {
            "json_schema": s,
            "temperature": 1.0,
            "seed": seed,
            "budget_aware": aware,
            "max_new_tokens": 128 if budget == "128" else least * int(budget[:-1]),
        }
        for s, least in schemas
        for seed in range(seeds)
    ]
    t = time.perf_counter()
    outs = engine.generate(["Answer in JSON:"] * len(params), sampling_params=params, progress=False)
    wall = time.perf_counter() - t
    valid = 0
    for p, o in zip(params, outs):
        try:
            jsonschema.validate(json.loads(o["text"]), p["json_schema"], format_checker=jsonschema.FormatChecker())
            valid += 1
        except (ValueError, jsonschema.ValidationError):
            pass
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    return {"outputs": len(outs), "valid": valid / len(outs), "tokens": tokens, "tok_s": tokens / wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--every", type=int, default=4, help="use every k-th schema of the sample")
    ap.add_argument("--seeds", type=int, default=10)
    args = ap.parse_args()
    dtype = dtype_name()
    with Engine(
        str(builtin_model_path()), dtype=dtype, max_running_requests=128, grammar_compile_timeout_s=30
    ) as engine:
        schemas = [
            (s, m) for s in enforced_schemas(args.every) if (m := minimum(engine, s)) is not None and m <= MAX_MINIMUM
        ]
        result: dict[str, Any] = {
            "schemas": len(schemas),
            "seeds": args.seeds,
            "dtype": dtype,
            "minimum_p50": sorted(m for _, m in schemas)[len(schemas) // 2],
            "runs": {},
        }
        for budget in BUDGETS:
            for aware in (True, False):
                result["runs"][f"{budget} {'on' if aware else 'off'}"] = run(engine, schemas, budget, aware, args.seeds)
    report(result)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "bench_budget.json").write_text(json.dumps(result, indent=2))
    chart(result)


def report(r: dict[str, Any]) -> None:
    print(
        f"\n{r['schemas']} JSONSchemaBench schemas x {r['seeds']} seeds, temperature 1, tiny random checkpoint, "
        f"{r['dtype']} (median minimum {r['minimum_p50']} tokens)"
    )
    print("| budget | valid, budget-aware | valid, off | tok/s on | tok/s off |")
    print("|---|---|---|---|---|")
    for budget in BUDGETS:
        on, off = r["runs"][f"{budget} on"], r["runs"][f"{budget} off"]
        label = f"{budget} the minimum" if budget.endswith("x") else f"{budget} tokens"
        print(f"| {label} | {on['valid']:.1%} | {off['valid']:.1%} | {on['tok_s']:.0f} | {off['tok_s']:.0f} |")


def chart(r: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    xs = range(len(BUDGETS))
    for i, mode in enumerate(("on", "off")):
        ax.bar(
            [x + i * 0.4 for x in xs],
            [r["runs"][f"{b} {mode}"]["valid"] * 100 for b in BUDGETS],
            0.4,
            label=f"budget-aware {mode}",
        )
    ax.set_xticks([x + 0.2 for x in xs], [f"{b} min" if b.endswith("x") else f"{b} tok" for b in BUDGETS])
    ax.set_ylabel("outputs that parse and validate (%)")
    ax.set_title(f"JSON within max_new_tokens: {r['schemas']} schemas x {r['seeds']} seeds, temperature 1")
    ax.legend()
    fig.tight_layout()
    fig.savefig(OUT / "bench_budget.png", dpi=100)


if __name__ == "__main__":
    main()
