"""Tool calling in the chat API: `tools` and `tool_choice` checked, tool turns rendered for
the chat template, calls forced by a grammar when the client requires one, and answers
split into content and `tool_calls` (whole, or as stream deltas)."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from arbor.grammar.json_schema import schema_to_regex
from arbor.grammar.nesting import check_json
from arbor.runtime.server.errors import ApiError, refusing
from arbor.runtime.server.tool_parsers import PARSERS, ToolCall, ToolParser

MAX_TOOLS = 128  # OpenAI's limit
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass
class ToolPlan:
    """What a chat request's tools ask of the answer. `choice` is "auto", "none", "required"
    or the one function's name."""

    parser: ToolParser | None
    functions: list[dict[str, Any]]
    choice: str
    parallel: bool

    @property
    def forced(self) -> bool:
        return self.choice not in ("auto", "none")

    def constraint(self) -> dict[str, Any]:
        """Sampling params that force the calls (required, or a named function)."""
        if not self.forced:
            return {}
        assert self.parser is not None
        chosen = (
            self.functions if self.choice == "required" else [f for f in self.functions if f["name"] == self.choice]
        )
        return {"regex": self.parser.forced(chosen, self.parallel)}

    def template_tools(self) -> list[dict[str, Any]] | None:
        """The tools as the chat template takes them (rendered under "none" too, as vLLM does)."""
        return [{"type": "function", "function": f} for f in self.functions] or None

    def split(self, text: str) -> tuple[int, list[ToolCall]]:
        """(where the content ends, the calls to known functions after it)."""
        if self.parser is None or self.choice == "none":
            return len(text), []
        at, calls = self.parser.split(text)
        known = {f["name"] for f in self.functions}
        return (at, calls) if calls and all(c.name in known for c in calls) else (len(text), [])

    def finish(self, reason: str | None, calls: list[ToolCall]) -> str | None:
        """OpenAI's finish reason: tool_calls when the model chose to call (a named function
        that was forced ends as stop)."""
        return "tool_calls" if calls and reason == "stop" and self.choice in ("auto", "required") else reason


def plan_tools(tools: Any, tool_choice: Any, parallel: Any, parser_name: str | None) -> ToolPlan | None:
    """Check a chat request's tool fields; None when it has no tools."""
    if not tools:
        if tool_choice not in ("auto", "none", None):
            raise ApiError(400, "tool_choice needs tools; send tools or omit tool_choice", param="tool_choice")
        return None
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise ApiError(400, f"tools must be a list of at most {MAX_TOOLS} tools", param="tools")
    functions = [_function(t, i) for i, t in enumerate(tools)]
    names = [f["name"] for f in functions]
    if len(set(names)) != len(names):
        raise ApiError(400, "two tools have the same function name; give each a distinct name", param="tools")
    choice = _choice(tool_choice if tool_choice is not None else "auto", names)
    for i, f in enumerate(functions):  # a forced call compiles its schema: a bad one is a 400 now
        if f.get("parameters") is not None and choice in ("required", f["name"]):
            with refusing("tools", f"tools[{i}] ({f['name']}): parameters schema is invalid: "):
                schema_to_regex(f["parameters"])
    if not isinstance(parallel, bool):
        raise ApiError(400, "parallel_tool_calls must be true or false", param="parallel_tool_calls")
    parser = PARSERS[parser_name]() if parser_name else None
    if parser is None and choice != "none":
        raise ApiError(
            400,
            "this server parses no tool calls: start it with --tool-call-parser "
            f'({"|".join(PARSERS)}) for the model\'s format, or send tool_choice "none"',
            param="tools",
        )
    return ToolPlan(parser, functions, choice, parallel)


def _function(tool: Any, i: int) -> dict[str, Any]:
    where = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        raise ApiError(400, f'{where} must be {{"type": "function", "function": {{...}}}}', param="tools")
    fn = tool["function"]
    if not isinstance(fn.get("name"), str) or not _NAME.fullmatch(fn["name"]):
        raise ApiError(400, f"{where}.function.name must be 1-64 letters, digits, _ or -", param="tools")
    params = fn.get("parameters")
    if params is not None and not (isinstance(params, dict) and params.get("type", "object") == "object"):
        raise ApiError(400, f"{where}.function.parameters must be a JSON Schema of type object", param="tools")
    unknown = set(fn) - {"name", "description", "parameters", "strict"}
    if unknown:
        raise ApiError(400, f"{where}.function has unknown fields {sorted(unknown)}", param="tools")
    if params is not None:
        _check_schema(params, f"{where} ({fn['name']})")
    return {k: fn[k] for k in ("name", "description", "parameters") if fn.get(k) is not None}


def _check_schema(params: dict[str, Any], where: str) -> None:
    """Every tool's parameters must be a valid JSON Schema (its draft's metaschema). Only forced
    tools are compiled: a valid schema that Arbor's compiler cannot take still works under auto."""
    import jsonschema

    try:
        jsonschema.validators.validator_for(params).check_schema(params)
    except jsonschema.SchemaError as e:
        at = "/".join(str(p) for p in e.absolute_path)
        raise ApiError(
            400, f"{where}: parameters schema is invalid: {e.message}" + (f" (at {at})" if at else ""), param="tools"
        ) from None


def _choice(choice: Any, names: list[str]) -> str:
    if choice in ("auto", "none", "required"):
        return choice
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or not isinstance(name, str):
        raise ApiError(
            400,
            'tool_choice must be "auto", "none", "required" or {"type": "function", "function": {"name": ...}}',
            param="tool_choice",
        )
    if name not in names:
        raise ApiError(
            400, f"tool_choice names {name!r}, which is not among the tools ({', '.join(names)})", param="tool_choice"
        )
    return name


def template_message(m: Any, content: str) -> dict[str, Any]:
    """A chat message as chat templates take it: tool results keep their call id; an
    assistant's tool calls carry their arguments as objects (Hugging Face's convention)."""
    out: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": content}
    if m.role == "tool":
        if not isinstance(m.tool_call_id, str):
            raise ApiError(
                400, "a message with role tool needs tool_call_id, the id of the call it answers", param="messages"
            )
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        out["name"] = m.name
    if m.tool_calls:
        if m.role != "assistant":
            raise ApiError(400, "only assistant messages carry tool_calls", param="messages")
        out["tool_calls"] = [_template_call(c) for c in m.tool_calls]
    return out


def _template_call(call: Any) -> dict[str, Any]:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise ApiError(400, "each tool call needs function: {name, arguments}", param="messages")
    args = fn.get("arguments", "{}")
    if isinstance(args, str):
        with refusing("messages"):
            check_json(args, f"function.arguments of the call to {fn['name']}")
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            raise ApiError(400, f"the arguments of the call to {fn['name']} are not JSON", param="messages") from None
    return {"id": call.get("id"), "type": "function", "function": {"name": fn["name"], "arguments": args}}


def wire_calls(calls: list[ToolCall]) -> list[dict[str, Any]]:
    """Calls as the OpenAI API writes them in a message."""
    return [
        {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": c.name, "arguments": c.arguments},
        }
        for c in calls
    ]


@dataclass
class ToolStream:
    """One streamed choice: content goes out while it surely is content; from where the
    tool-call section may start, text is held until the answer ends. A forced answer (its
    grammar guarantees the calls) in a JSON format streams each call as it is written: id,
    type and name once the name is whole, then the arguments' text as it grows."""

    plan: ToolPlan
    sent: int = 0
    calls: list[ToolCall] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)  # calls announced so far
    args_sent: list[int] = field(default_factory=list)

    def step(self, text: str, done: bool) -> str:
        """New content to send, given the whole text so far; at the end, the calls are in `calls`."""
        if done:
            end, self.calls = self.plan.split(text)
            if not self.calls and self.ids:
                end = self.sent  # a forced call cut short (max_tokens) stays a call, as OpenAI's does
        elif self.plan.parser is None or self.plan.choice == "none":
            end = len(text)
        else:
            end = self.plan.parser.content_end(text)
        new = text[self.sent : max(end, self.sent)]
        self.sent = max(end, self.sent)
        return new.rstrip() if done and self.calls else new

    def progress(self, text: str) -> list[dict[str, Any]]:
        """Tool-call deltas for the calls written so far (forced answers only)."""
        if not self.plan.forced or self.plan.parser is None:
            return []
        return self._send([(c.name, c.arguments) for c in self.plan.parser.partial_calls(text[self.sent :])])

    def deltas(self) -> list[dict[str, Any]]:
        """After the end: what is left of the calls, as OpenAI streams them."""
        return self._send([(c.name, c.arguments) for c in self.calls])

    def _send(self, calls: list[tuple[str | None, str]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for i, (name, arguments) in enumerate(calls):
            if i == len(self.ids):
                if name is None:
                    break
                self.ids.append(f"call_{uuid.uuid4().hex[:24]}")
                self.args_sent.append(0)
                out.append(
                    {"index": i, "id": self.ids[i], "type": "function", "function": {"name": name, "arguments": ""}}
                )
            new = arguments[self.args_sent[i] :]
            if new:
                out.append({"index": i, "function": {"arguments": new}})
                self.args_sent[i] = len(arguments)
        return out
