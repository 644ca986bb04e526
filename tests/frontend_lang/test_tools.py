"""The DSL's tool-calling helpers: a Python function's signature becomes its parameters
schema, `gen_tool_call` constrains to a call of one of the tools, `call_tool` runs it."""

from __future__ import annotations

import json

import pytest

import arbor as sgl
from arbor.frontend_lang.tools import tool_spec


def area(width: float, height: float, unit: str = "m") -> str:
    """Area of a rectangle."""
    return f"{width * height} {unit}2"


def test_a_signature_becomes_a_schema():
    spec = tool_spec(area)
    assert spec["name"] == "area" and spec["description"] == "Area of a rectangle."
    params = spec["parameters"]
    assert params["properties"] == {
        "width": {"type": "number"},
        "height": {"type": "number"},
        "unit": {"type": "string"},
    }
    assert params["required"] == ["width", "height"]


def test_gen_tool_call_constrains_to_the_tools_and_call_tool_runs_it():
    node = sgl.gen_tool_call("act", [area, {"name": "noop", "parameters": {"type": "object", "properties": {}}}])
    schema = json.loads(node.params.json_schema)
    assert [branch["properties"]["name"]["const"] for branch in schema["anyOf"]] == ["area", "noop"]
    assert sgl.call_tool('{"name": "area", "arguments": {"width": 2, "height": 3}}', [area]) == "6 m2"
    with pytest.raises(ValueError, match="no tool named"):
        sgl.call_tool({"name": "nope", "arguments": {}}, [area])
