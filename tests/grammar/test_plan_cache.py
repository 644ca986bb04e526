"""The regex plan cache: bounded in bytes, and only requests that ran fill its kept area."""

from __future__ import annotations

import json

from arbor.grammar.constraint import PLANS, Constraint, keep_plan, plan
from arbor.grammar.json_schema import RegexPlan
from arbor.grammar.plan_cache import PlanCache, plan_bytes


def _schema(i: int, width: int = 50) -> Constraint:
    """A distinct schema whose regex grows with `width` (an enum of long strings)."""
    values = [f"value-{i}-{j}-" + "x" * width for j in range(20)]
    return Constraint("json_schema", json.dumps({"enum": values}))


def test_kept_plans_stay_under_their_byte_bound_and_the_oldest_go_first():
    cache = PlanCache(kept_bytes=200_000, probation_bytes=100_000)
    keys = [_schema(i) for i in range(100)]
    for key in keys:
        cache.trial(key, plan(key))
        cache.keep(key)
        assert cache.kept.nbytes <= 200_000 and cache.probation.nbytes <= 100_000
    assert cache.kept.nbytes == sum(plan_bytes(k, plan(k)) for k in keys if cache.kept.get(k) is not None)
    assert cache.get(keys[-1]) is not None and cache.get(keys[0]) is None
    assert 0 < len(cache.kept) < len(keys)


def test_refused_requests_never_fill_the_kept_area():
    cache = PlanCache(kept_bytes=200_000, probation_bytes=20_000)
    good = _schema(-1)
    cache.trial(good, plan(good))
    cache.keep(good)
    for i in range(200):  # validated, then refused: never kept
        key = _schema(i)
        cache.trial(key, plan(key))
    assert cache.get(good) is not None and len(cache.kept) == 1
    assert cache.probation.nbytes <= 20_000


def test_a_plan_larger_than_the_bound_is_computed_but_not_held():
    cache = PlanCache(kept_bytes=1000, probation_bytes=1000)
    big = _schema(0, width=500)
    assert cache.trial(big, plan(big)).regex
    cache.keep(big)
    assert cache.nbytes == 0 and cache.get(big) is None


def test_plan_holds_on_probation_until_its_request_ran():
    key = _schema(12345)
    computed = plan(key)
    assert PLANS.probation.get(key) is computed and PLANS.kept.get(key) is None
    keep_plan(key)
    assert PLANS.kept.get(key) is computed and PLANS.probation.get(key) is None
    assert plan(key) is computed


def test_plan_bytes_counts_key_regex_and_unenforced():
    key = Constraint("regex", "a" * 1000)
    entry = RegexPlan("b" * 5000, ["minLength"])
    assert 6000 < plan_bytes(key, entry) < 6300
