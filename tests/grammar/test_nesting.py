"""Nesting scans: exact depths without recursing, strings and escapes skipped."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from arbor.grammar.nesting import (
    MAX_DEPTH,
    TooDeep,
    check_json,
    check_regex,
    json_depth,
    regex_depth,
    too_deep_path,
)

# Strings full of what a naive bracket count would trip on: brackets, quotes, backslashes.
TRICKY = st.text(alphabet='[]{}"\\ab\n\u00e9', max_size=8)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | TRICKY,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TRICKY, inner, max_size=3),
    max_leaves=30,
)


def _depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


@given(JSON)
def test_json_depth_is_the_parsed_depth(value):
    text = json.dumps(value, ensure_ascii=False)
    assert json_depth(text) == json_depth(text.encode()) == _depth(value)


# Keys a dotted path spells unambiguously; values as tricky as above.
KEYED = st.recursive(
    st.none() | TRICKY,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(alphabet="ab_", min_size=1, max_size=3), inner, max_size=3)
    ),
    max_leaves=30,
)


@given(KEYED)
def test_too_deep_path_leads_to_a_container_past_the_limit(value):
    text = json.dumps(value, ensure_ascii=False)
    limit = _depth(value) - 1
    if limit < 1:
        return
    found, parts = value, re.findall(r"\[(\d+)\]|([^.\[]+)", too_deep_path(text.encode(), limit))
    for index, key in parts:
        found = found[int(index)] if index else found[key]
    assert len(parts) == min(limit, 8) and _depth(found) >= limit + 1 - len(parts) > 0


def test_a_deep_body_is_refused_without_recursing():
    deep = b'{"a": "[[[[", "b": {"c": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}"
    with pytest.raises(TooDeep, match=f"100002 levels deep; the limit is {MAX_DEPTH}"):
        check_json(deep, "the body")
    assert too_deep_path(deep) == "b.c[0][0][0][0][0][0]"
    check_json('{"a": "' + "[" * 1000 + '"}', "text")  # brackets inside a string are text


def test_regex_depth_skips_escapes_and_character_classes():
    assert regex_depth(r"(a\((b))[(((]") == 2
    assert regex_depth(r"[]((](?:(a))") == 2
    assert regex_depth(r"\\((x))") == 2  # an escaped backslash, then real groups
    check_regex("(" * MAX_DEPTH + "a" + ")" * MAX_DEPTH, "regex")
    with pytest.raises(TooDeep, match="regex nests groups 5000 levels deep"):
        check_regex("(" * 5000 + "a" + ")" * 5000, "regex")
