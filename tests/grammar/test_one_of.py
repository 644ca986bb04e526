"""oneOf: each branch is generated so that no output matches two branches (narrowed where
needed), or the schema is refused up front naming two overlapping branches."""

from __future__ import annotations

import json

import jsonschema
import pytest

from arbor.grammar.json_schema import schema_to_regex
from arbor.grammar.regex_parts import SchemaError

_OBJ = {"type": "object"}
EXCLUSIVE = {
    "types": {"oneOf": [{"type": "string", "maxLength": 4}, {"type": "null"}, {"type": "boolean"}]},
    "discriminator": {
        "oneOf": [
            {
                **_OBJ,
                "properties": {"k": {"const": "a"}, "x": {"type": "integer", "minimum": 0, "maximum": 9}},
                "required": ["k", "x"],
            },
            {**_OBJ, "properties": {"k": {"const": "b"}, "y": {"type": "boolean"}}, "required": ["k", "y"]},
        ]
    },
    "shared_enum_values": {"oneOf": [{"enum": [1, 2, 3]}, {"enum": [3, 4]}]},
    "required_keys": {
        **_OBJ,
        "properties": {"r": {"type": "boolean"}, "w": {"type": "boolean"}, "h": {"type": "boolean"}},
        "oneOf": [{"required": ["r"]}, {"required": ["w", "h"]}],
    },
    "closed_objects": {
        "oneOf": [
            {**_OBJ, "additionalProperties": False, "properties": {"key": {"enum": ["p", "q"]}}},
            {
                **_OBJ,
                "additionalProperties": False,
                "properties": {"keys": {"type": "array", "items": {"enum": ["p"]}, "maxItems": 2}},
            },
        ]
    },
    "arrays_of_kinds": {
        "oneOf": [
            {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
            {"type": "array", "items": {"enum": ["s"]}, "maxItems": 3},
        ]
    },
}
OVERLAPPING = {
    "integer_and_number": {"oneOf": [{"type": "integer"}, {"type": "number"}]},
    "string_and_short_string": {"oneOf": [{"type": "string", "maxLength": 3}, {"type": "string"}]},
}


@pytest.mark.parametrize("name", sorted(EXCLUSIVE))
def test_every_output_matches_exactly_one_branch(gpt2_family, name: str) -> None:
    schema = EXCLUSIVE[name]
    assert "oneOf" not in schema_to_regex(schema).unenforced  # enforced by the masks, not checked after
    for seed in range(12):
        text, ended, _ = gpt2_family.walk({"json_schema": schema}, seed, max_tokens=400)
        assert ended, (seed, text)
        jsonschema.validate(json.loads(text), schema)  # oneOf: exactly one branch


def test_narrowed_branches_still_reach_every_branch(gpt2_family) -> None:
    seen = set()
    for seed in range(30):
        text, _, _ = gpt2_family.walk({"json_schema": EXCLUSIVE["required_keys"]}, seed, max_tokens=200)
        seen.add(frozenset(json.loads(text)))
    assert any("r" in keys for keys in seen) and any({"w", "h"} <= keys for keys in seen)
    assert not any({"r", "w", "h"} <= keys for keys in seen)  # that object would match both branches


@pytest.mark.parametrize("name", sorted(OVERLAPPING))
def test_overlap_that_cannot_be_excluded_is_refused_up_front(name: str) -> None:
    with pytest.raises(SchemaError, match=r"oneOf branches 0 \(.*\) and 1 \(.*\) may both match one output"):
        schema_to_regex(OVERLAPPING[name])
