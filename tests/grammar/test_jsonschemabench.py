"""JSONSchemaBench sample (../shared/data/jsonschemabench): coverage must not regress.

Every 25th schema of the 275 (11, across the subsets): at least 80% compile within 10 s
(bench_grammar measured 88% on every 11th and 93% on all 275), every random walk that
ends validates, and at least half of the sample's valid instances are accepted by the FSM.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from arbor.grammar.backends.outlines import GrammarMatcher
from arbor.grammar.compiler import GrammarError
from arbor.grammar.constraint import constraint_from_params

BENCH = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "jsonschemabench"


def test_jsonschemabench_sample_coverage(gpt2_family) -> None:
    files = sorted(BENCH.glob("*.json"))[::25]
    if not files:
        pytest.skip("JSONSchemaBench sample not beside this checkout (../shared/data)")
    compiled = instances = accepted = 0
    for path in files:
        data = json.loads(path.read_text())
        try:
            grammar = gpt2_family.compiler.compile(constraint_from_params({"json_schema": data["schema"]}))
        except (ValueError, GrammarError):
            continue
        compiled += 1
        text, ended, _ = gpt2_family.walk({"json_schema": data["schema"]}, 0, max_tokens=2000)
        if ended:
            validator = jsonschema.validators.validator_for(data["schema"])(data["schema"])
            assert validator.is_valid(json.loads(text)), (path.name, text[:300])
        for case in data.get("tests", []):
            if case.get("valid"):
                instances += 1
                m = GrammarMatcher(grammar)
                text = json.dumps(case["data"], ensure_ascii=False, separators=(", ", ": "))
                accepted += m.accept_tokens(gpt2_family.retok.encode(text.encode())) and m.allows_end()
    assert compiled / len(files) >= 0.8, f"{compiled}/{len(files)} compiled"
    assert accepted >= instances / 2, f"{accepted}/{instances} valid instances accepted"
