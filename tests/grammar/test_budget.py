"""Budget-aware constrained decoding: a JSON output closes before max_new_tokens runs out.

40 schemas of the JSONSchemaBench sample (whose keywords are all enforced during decoding),
10 seeds at temperature 1 on the random tiny checkpoint, budgets from the schema's minimum up
to 4x: every output parses and validates. A budget below the minimum is refused with a 400
that names it; with budget_aware=false the same budgets cut outputs short.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

from arbor.runtime.engine import Engine
from arbor.runtime.io.tokenizer_manager import RequestRefused

BENCH = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "jsonschemabench"
NAMES = (
    "Github_easy---o12222",
    "Github_easy---o21730",
    "Github_easy---o39397",
    "Github_easy---o5474",
    "Github_easy---o68314",
    "Github_easy---o82294",
    "Github_easy---o89621",
    "Github_hard---o7313",
    "Github_medium---o82696",
    "Github_medium---o90830",
    "Github_trivial---o55101",
    "Github_trivial---o66311",
    "Github_trivial---o78404",
    "Github_trivial---o89637",
    "Github_ultra---o13934",
    "Github_ultra---o84269",
    "Glaiveai2K---calculate_area_202544c4",
    "Glaiveai2K---calculate_area_84607e3f",
    "Glaiveai2K---calculate_carbon_footprint_85d634a2",
    "Glaiveai2K---calculate_shipping_cost_b91abc2d",
    "Glaiveai2K---create_invoice_d2546e08",
    "Glaiveai2K---generate_random_password_0b5e94e6",
    "Glaiveai2K---search_jobs_2df22946",
    "Glaiveai2K---search_product_e033cad8",
    "JsonSchemaStore---label-commenter-config",
    "JsonSchemaStore---sounds",
    "Kubernetes---kb_1023_Normalized",
    "Kubernetes---kb_1125_Normalized",
    "Kubernetes---kb_214_Normalized",
    "Kubernetes---kb_871_Normalized",
    "MCPspec---CompleteRequest",
    "MCPspec---LoggingMessageNotification",
    "MCPspec---SetLevelRequest",
    "Snowplow---sp_159_Normalized",
    "Snowplow---sp_238_Normalized",
    "Snowplow---sp_392_Normalized",
    "WashingtonPost---wp_108_Normalized",
    "WashingtonPost---wp_50_Normalized",
    "WashingtonPost---wp_65_Normalized",
    "WashingtonPost---wp_88_Normalized",
)
SEEDS = range(10)


@pytest.fixture(scope="module")
def engine(tiny_model):
    with Engine(str(tiny_model("llama")), max_running_requests=128, grammar_compile_timeout_s=60) as e:
        yield e


@pytest.fixture(scope="module")
def schemas(engine) -> list[tuple[dict, int]]:
    """(schema, the fewest tokens it needs), learnt from the refusal of a 1-token budget."""
    if not (BENCH / f"{NAMES[0]}.json").exists():
        pytest.skip("JSONSchemaBench sample not beside this checkout (../shared/data)")
    out = []
    for name in NAMES:
        schema = json.loads((BENCH / f"{name}.json").read_text())["schema"]
        try:
            engine.generate(prompt="x", sampling_params={"json_schema": schema, "max_new_tokens": 1}, progress=False)
            least = 1
        except RequestRefused as e:
            assert e.status == 400, e
            least = int(re.search(r"below the (\d+) tokens", str(e)).group(1))
            assert f"raise it (max_tokens) to {least} or more" in str(e)
        out.append((schema, least))
    return out


def _run(engine: Engine, schemas: list[tuple[dict, int]], times: int, **extra) -> list[tuple[dict, dict]]:
    params = [
        {"json_schema": s, "max_new_tokens": least * times, "temperature": 1.0, "seed": seed, **extra}
        for s, least in schemas
        for seed in SEEDS
    ]
    outs = engine.generate(prompt=["Answer in JSON:"] * len(params), sampling_params=params, progress=False)
    return list(zip(params, outs))


@pytest.mark.parametrize("times", [1, 2, 4])
def test_every_output_closes_within_its_budget(engine, schemas, times):
    assert len(schemas) >= 30
    for params, out in _run(engine, schemas, times):
        schema = params["json_schema"]
        jsonschema.validate(json.loads(out["text"]), schema, format_checker=jsonschema.FormatChecker())
        assert out["meta_info"]["completion_tokens"] <= params["max_new_tokens"]


def test_without_budget_awareness_the_same_budgets_cut_outputs(engine, schemas):
    cut = sum(
        out["meta_info"]["finish_reason"]["type"] == "length" for _, out in _run(engine, schemas, 2, budget_aware=False)
    )
    assert cut > 0


def test_the_minimum_is_exact(engine, schemas):
    """At its minimum a schema's output uses every token: the minimum is not padded."""
    used = [
        out["meta_info"]["completion_tokens"] == params["max_new_tokens"] for params, out in _run(engine, schemas, 1)
    ]
    assert sum(used) >= len(used) * 0.9
