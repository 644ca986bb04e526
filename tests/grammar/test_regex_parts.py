"""Regex building blocks against brute force: integer ranges, bounded numbers, patterns."""

from __future__ import annotations

import json
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from arbor.grammar.json_schema import schema_to_regex
from arbor.grammar.regex_parts import bounded_number, escape, int_range, pattern_contents

bound = st.one_of(st.none(), st.integers(-1200, 1200))


@settings(max_examples=150, deadline=None)
@given(bound, bound)
def test_int_range_matches_exactly_the_integers_in_range(low, high) -> None:
    if low is not None and high is not None and low > high:
        low, high = high, low
    rx = re.compile(int_range(low, high))
    for n in range(-1500, 1501):
        inside = (low is None or n >= low) and (high is None or n <= high)
        assert bool(rx.fullmatch(str(n))) == inside, (low, high, n)
    assert not rx.fullmatch("007") and not rx.fullmatch("-0")


@settings(max_examples=80, deadline=None)
@given(st.integers(-30, 30), st.integers(-30, 30), st.booleans())
def test_bounded_number_matches_exactly_the_decimals_in_range(a, b, exclusive) -> None:
    low, high = min(a, b), max(a, b)
    if exclusive and (low == high or high <= 0):
        exclusive = False
    rx = re.compile(bounded_number(low, high, exclusive))
    for text in ("0", "0.5", "-0.25", "1", "1.0", "2.75", "-3", "-3.5", "10", "29.99", "30", "-30", "-30.5", "31"):
        x = float(text)
        inside = low <= x and (x < high if exclusive else x <= high)
        assert bool(rx.fullmatch(text)) == inside, (low, high, exclusive, text)


def test_escape_is_literal() -> None:
    text = 'a.b*c+(d)[e]{f}|g^h$i\\j?k-l#m&n~o\tp\nq"r'
    assert re.fullmatch(escape(text), text)


def test_unanchored_pattern_is_a_search() -> None:
    rx = re.compile('"' + pattern_contents("ab+c") + '"')
    assert rx.fullmatch('"xxabbbcyy"') and rx.fullmatch('"abc"')
    assert not rx.fullmatch('"ac"')


def test_pattern_shorthands_and_quotes_stay_valid_json() -> None:
    rx = re.compile('"' + pattern_contents(r'^\d{2}\s\w+"\.$') + '"')
    assert rx.fullmatch('"12 ab_9\\".x"'.replace(".x", "."))
    assert json.loads('"12 ab_9\\"."') == '12 ab_9".'


def test_unenforced_keywords_are_reported() -> None:
    plan = schema_to_regex({"type": "array", "items": {"type": "integer"}, "uniqueItems": True})
    assert plan.unenforced == ["uniqueItems"]
    assert schema_to_regex({"type": "integer", "minimum": 1}).unenforced == []


def test_recursive_refs_are_cut_off_but_stay_valid() -> None:
    schema = {"$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}}}, "$ref": "#/$defs/n"}
    rx = re.compile(schema_to_regex(schema).regex)
    assert rx.fullmatch('{"next": {}}') and rx.fullmatch("{}")


def test_the_post_check_reports_a_number_too_large_for_multiple_of() -> None:
    """`1e400` matches the JSON number regex but parses to infinity: the check says invalid
    instead of raising (once an HTTP 500)."""
    from arbor.grammar.constraint import Constraint, check_output

    schema = Constraint(kind="json_schema", text=json.dumps({"type": "number", "multipleOf": 0.01}))
    assert check_output(schema, "1e400", ["multipleOf"])["valid"] is False
    assert check_output(schema, "0.25", ["multipleOf"])["valid"] is True


def test_conditional_keywords_are_reported_not_dropped() -> None:
    """`if`/`then` (and the dependent* family) cannot be a regex: they must reach the post-check,
    or an output that breaks them would finish as `stop`."""
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
        "if": {"properties": {"b": {"const": 1}}},
        "then": {"required": ["a"]},
    }
    assert schema_to_regex(schema).unenforced == ["if"]
    assert schema_to_regex({"type": "object", "dependentRequired": {"a": ["b"]}}).unenforced == ["dependentRequired"]
