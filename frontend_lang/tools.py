"""Tool calling in the DSL: `gen_tool_call` generates a JSON call to one of the given tools
(its arguments valid for that tool's parameters), `call_tool` runs it.

    s += "Action: " + sgl.gen_tool_call("action", [calculate, lookup, finish])
    result = sgl.call_tool(s["action"], [calculate, lookup, finish])

A tool is a Python function (its signature becomes the parameters schema: annotations int,
float, bool and str, a parameter without a default is required) or an OpenAI function spec
(`{"name", "description", "parameters"}`).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from typing import Any

from arbor.frontend_lang.api import gen
from arbor.frontend_lang.ir import Gen, Select

_TYPES = {int: "integer", float: "number", bool: "boolean", str: "string"}
_BY_NAME = {t.__name__: kind for t, kind in _TYPES.items()}
Tool = Callable[..., Any] | dict[str, Any]


def tool_spec(tool: Tool) -> dict[str, Any]:
    """The OpenAI function spec of a tool."""
    if isinstance(tool, dict):
        if not isinstance(tool.get("name"), str):
            raise ValueError(f"a tool spec needs a name: {tool!r}")
        return tool
    props, required = {}, []
    for name, p in inspect.signature(tool).parameters.items():
        kind = _TYPES.get(p.annotation) or _BY_NAME.get(p.annotation)  # postponed annotations are strings
        props[name] = {"type": kind} if kind else {}
        if p.default is inspect.Parameter.empty:
            required.append(name)
    return {
        "name": tool.__name__,
        "description": inspect.getdoc(tool) or "",
        "parameters": {"type": "object", "properties": props, "required": required, "additionalProperties": False},
    }


def gen_tool_call(name: str, tools: list[Tool], max_tokens: int = 96, **kwargs: Any) -> Gen | Select:
    """Generate into `name` a call `{"name": ..., "arguments": {...}}` to one of `tools`. The
    JSON always closes within `max_tokens` (budget-aware decoding)."""
    specs = [tool_spec(t) for t in tools]
    if not specs:
        raise ValueError("gen_tool_call needs at least one tool")
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"const": s["name"]},
                "arguments": s.get("parameters") or {"type": "object", "properties": {}},
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for s in specs
    ]
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
    return gen(name, max_tokens=max_tokens, json_schema=schema, **kwargs)


def call_tool(call: str | dict[str, Any], tools: list[Callable[..., Any]]) -> Any:
    """Run a generated call with the Python function of its name."""
    parsed = json.loads(call) if isinstance(call, str) else call
    by_name = {t.__name__: t for t in tools}
    if parsed.get("name") not in by_name:
        raise ValueError(f"no tool named {parsed.get('name')!r}; tools: {', '.join(by_name)}")
    return by_name[parsed["name"]](**parsed.get("arguments", {}))
