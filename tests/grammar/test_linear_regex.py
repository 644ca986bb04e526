"""User regexes run on RE2: a pattern RE2 cannot run is refused with a reason, and a
catastrophic-backtracking pattern checks a long text in linear time."""

from __future__ import annotations

import json
import time

import pytest

from arbor.grammar.constraint import Constraint, check_output, constraint_from_params
from arbor.grammar.linear_regex import check_schema_patterns, compile_ecma, compile_linear


@pytest.mark.parametrize("pattern", ["(?=a)b", "(?!a)b", "(?<=a)b", "(?<!a)b", r"(a)\1", "(?P<x>a)(?P=x)", "(?>a)"])
def test_a_pattern_that_needs_backtracking_is_refused_naming_the_field(pattern):
    with pytest.raises(ValueError, match=r"^stop_regex .* is not supported: .*backtracking engine.*rewrite"):
        compile_linear(pattern, "stop_regex")


def test_invalid_and_too_large_patterns_say_what_to_change():
    with pytest.raises(ValueError, match="is not a valid regular expression: missing"):
        compile_linear("[a", "stop_regex")
    with pytest.raises(ValueError, match=r"counted repeats up to \{1000\}"):
        compile_linear("a{1001}", "stop_regex")
    with pytest.raises(ValueError, match="too large for the linear-time regex engine"):
        compile_linear(r"\pL{256}", "stop_regex")


def test_an_ecma_unicode_escape_means_the_same_character_in_re2():
    assert compile_ecma(r"^\u0041+$", "pattern").search("AAA")
    assert not compile_ecma(r"^\\u0041$", "pattern").search("A")  # an escaped backslash, then "u0041"


def test_a_schema_pattern_re2_cannot_run_is_refused_at_any_depth():
    deep: dict = {"type": "string", "pattern": "(?=x)x"}
    for _ in range(5000):
        deep = {"type": "array", "items": deep}
    with pytest.raises(ValueError, match=r"json_schema pattern .* is not supported"):
        check_schema_patterns(deep)
    with pytest.raises(ValueError, match="json_schema patternProperties key"):
        check_schema_patterns({"patternProperties": {r"(a)\1": {}}})
    with pytest.raises(ValueError, match="json_schema pattern"):
        constraint_from_params({"json_schema": {"type": "string", "pattern": "(?<=a)b"}}, "xgrammar")


def test_unevaluated_properties_beside_pattern_properties_is_refused():
    with pytest.raises(ValueError, match="unevaluatedProperties together with patternProperties"):
        check_schema_patterns({"patternProperties": {"^a": {}}, "unevaluatedProperties": False})
    check_schema_patterns({"patternProperties": {"^a": {}}, "additionalProperties": False})


def test_a_request_s_patterns_have_one_compile_budget():
    schema = {"anyOf": [{"type": "string", "pattern": rf"(?i)[\pL\pN\pM]{{{40 + i}}}"} for i in range(5)]}
    with pytest.raises(ValueError, match="RE2 instructions in all"):
        check_schema_patterns(schema)


def test_a_catastrophic_pattern_checks_a_long_key_in_linear_time():
    # Python's re takes about 2**40 steps on each of these keys.
    schema = {
        "type": "object",
        "patternProperties": {"^(a+)+$": {"type": "integer"}},
        "additionalProperties": False,
        "properties": {"s": {"type": "string", "pattern": "^(a|aa)+$"}},
    }
    constraint = Constraint("json_schema", json.dumps(schema))
    started = time.perf_counter()
    bad_key = check_output(constraint, json.dumps({"a" * 40 + "b": 1}), ["everything"])
    bad_value = check_output(constraint, json.dumps({"s": "a" * 40 + "b"}), ["everything"])
    good = check_output(constraint, json.dumps({"a" * 40: 1, "s": "a" * 40}), ["everything"])
    assert time.perf_counter() - started < 1.0
    assert not bad_key["valid"] and "additional properties" in bad_key["error"]
    assert not bad_value["valid"] and "does not match" in bad_value["error"]
    assert good["valid"], good


def test_arbor_s_own_scans_of_user_text_stay_linear():
    # On Python's re each of these texts takes time quadratic in its length (minutes here).
    from arbor.grammar.nesting import json_depth, regex_depth
    from arbor.runtime.server.redact import public

    n = 200_000
    started = time.perf_counter()
    assert json_depth(b"[" + b'"\\' * n) == 1  # a string that never closes
    assert regex_depth("[" * n) == 0
    assert public("/a" * n) == "/a" * n and public("at /a/b/y.py:3") == "at y.py:3"
    with pytest.raises(ValueError, match="NUL"):
        constraint_from_params({"regex": "\\[^" * 60_000 + "\\x00"})
    assert time.perf_counter() - started < 2.0
