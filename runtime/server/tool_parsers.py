"""Tool-call formats of the model families (`--tool-call-parser`): how a call is written, how
to find calls in generated text, and the regex that makes a forced call well formed.

  qwen25    <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>   (one block per call)
  llama3    {"name": "f", "parameters": {...}}    (calls joined by "; ", maybe after <|python_tag|>)
  mistral   [TOOL_CALLS] [{"name": "f", "arguments": {...}}, ...]
  pythonic  [f(a=1, b="x"), g()]                  (Python call syntax; JSON literals accepted)

Text before the first call is the message content; a call that does not parse stays text.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from typing import Any

from arbor.grammar.json_schema import schema_to_regex
from arbor.grammar.regex_parts import alternation, escape

MAX_PARALLEL_CALLS = 4  # calls one forced (required) answer may hold when parallel calls are on


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object's text, as the model wrote it


@dataclass(frozen=True)
class PartialCall:
    """A call being written: its name once complete, the arguments' text so far."""

    name: str | None
    arguments: str


class ToolParser:
    """One family's format. `start` opens the tool-call section of an answer."""

    start: str = ""
    args_key = "arguments"

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        """(content, calls) of a finished answer; no calls if the section does not parse."""
        at, calls = self.split(text)
        return (text[:at].strip(), calls) if calls else (text, [])

    def split(self, text: str) -> tuple[int, list[ToolCall]]:
        """(where the content ends, the calls after it) of a finished answer."""
        at = self.find(text)
        if at < 0:
            return len(text), []
        try:
            calls = self.calls(text[at:])
        except (ValueError, SyntaxError, TypeError, KeyError, RecursionError):
            return len(text), []
        return (at, calls) if calls else (len(text), [])

    def find(self, text: str) -> int:
        """Where the tool-call section starts, or -1."""
        return text.find(self.start)

    def content_end(self, text: str) -> int:
        """How much of a partial answer is surely content: the section may start after it."""
        at = text.find(self.start)
        if at >= 0:
            return at
        for k in range(min(len(self.start) - 1, len(text)), 0, -1):
            if self.start.startswith(text[-k:]):
                return len(text) - k
        return len(text)

    def calls(self, section: str) -> list[ToolCall]:
        raise NotImplementedError

    def partial_calls(self, section: str) -> list[PartialCall]:
        """The calls of a section still being written, as far as they go: each JSON object's
        name and arguments text, in order (a stream sends the arguments as they grow)."""
        out, pos = [], 0
        while (at := section.find("{", pos)) >= 0:
            members, end = _read_object(section, at)
            name = members.get("name")
            args = next((members[k] for k in (self.args_key, "arguments", "parameters") if k in members), None)
            out.append(
                PartialCall(
                    name[2] if name is not None and name[3] and isinstance(name[2], str) else None,
                    section[args[0] : args[1]] if args is not None else "",
                )
            )
            if end is None:
                break
            pos = end
        return out

    def forced(self, functions: list[dict[str, Any]], parallel: bool) -> str:
        """Regex of an answer that is only calls to `functions` (one, or up to
        MAX_PARALLEL_CALLS when parallel), each call's arguments valid for its parameters."""
        one = alternation([self.call_regex(f) for f in functions])
        return self.section(one, MAX_PARALLEL_CALLS if parallel else 1)

    def call_regex(self, function: dict[str, Any]) -> str:
        schema = {
            "type": "object",
            "properties": {"name": {"const": function["name"]}, self.args_key: _parameters(function)},
            "required": ["name", self.args_key],
            "additionalProperties": False,
        }
        return schema_to_regex(schema).regex

    def section(self, call: str, most: int) -> str:
        raise NotImplementedError

    def _json_call(self, text: str, at: int) -> ToolCall:
        """The call in the JSON object at text[at]; its arguments keep the model's text."""
        members, end = _read_object(text, at)
        if end is None:
            raise ValueError("the call is cut short")
        name = members.get("name")
        args = next((members[k] for k in (self.args_key, "arguments", "parameters") if k in members), None)
        if name is None or not isinstance(name[2], str) or args is None or not isinstance(args[2], dict):
            raise ValueError("not a tool call")
        return ToolCall(name[2], text[args[0] : args[1]])


class Qwen25Parser(ToolParser):
    start = "<tool_call>"
    end = "</tool_call>"

    def calls(self, section: str) -> list[ToolCall]:
        out: list[ToolCall] = []
        for block in section.split(self.start)[1:]:
            body, closed, _ = block.partition(self.end)
            if not closed and out:
                break  # a last block cut short (max_tokens) is dropped
            out.append(self._json_call(body, body.index("{")))
        return out

    def section(self, call: str, most: int) -> str:
        newline = escape("\n")
        block = f"{escape(self.start)}{newline}{call}{newline}{escape(self.end)}"
        return block + (f"(?:{newline}{block}){{0,{most - 1}}}" if most > 1 else "")


class Llama3Parser(ToolParser):
    start = "<|python_tag|>"
    args_key = "parameters"

    def find(self, text: str) -> int:
        at = text.find(self.start)
        if at >= 0:
            return at
        stripped = text.lstrip()
        return len(text) - len(stripped) if stripped.startswith("{") else -1

    def content_end(self, text: str) -> int:
        stripped = text.lstrip()
        return 0 if not stripped or stripped[0] == "{" else super().content_end(text)

    def calls(self, section: str) -> list[ToolCall]:
        section = section.removeprefix(self.start).strip()
        decoder, out, pos = json.JSONDecoder(), [], 0
        while pos < len(section):
            start = pos
            _, pos = decoder.raw_decode(section, pos)
            out.append(self._json_call(section, start))
            rest = section[pos:].lstrip()
            if not rest:
                break
            if not rest.startswith(";"):
                raise ValueError("text after a call")
            pos = len(section) - len(rest[1:].lstrip())
        return out

    def section(self, call: str, most: int) -> str:
        return call + (f"(?:; {call}){{0,{most - 1}}}" if most > 1 else "")


class MistralParser(ToolParser):
    start = "[TOOL_CALLS]"

    def calls(self, section: str) -> list[ToolCall]:
        body = section.removeprefix(self.start).strip()
        items = json.loads(body)
        if not isinstance(items, list):
            return [self._json_call(body, 0)]
        out, pos = [], 1
        for _ in items:
            at = body.index("{", pos)
            out.append(self._json_call(body, at))
            pos = _read_object(body, at)[1] or len(body)
        return out

    def section(self, call: str, most: int) -> str:
        return f"{escape(self.start)} \\[{call}" + (f"(?:, {call}){{0,{most - 1}}}" if most > 1 else "") + r"\]"


class PythonicParser(ToolParser):
    start = "["

    def find(self, text: str) -> int:
        stripped = text.lstrip()
        return len(text) - len(stripped) if stripped.startswith("[") and stripped.rstrip().endswith(")]") else -1

    def content_end(self, text: str) -> int:
        stripped = text.lstrip()
        return 0 if not stripped or stripped[0] == "[" else len(text)

    def partial_calls(self, section: str) -> list[PartialCall]:
        return []  # Python call syntax becomes JSON only once a call is whole

    def calls(self, section: str) -> list[ToolCall]:
        tree = ast.parse(section.strip(), mode="eval").body
        if not isinstance(tree, ast.List):
            raise ValueError("not a list of calls")
        out = []
        for node in tree.elts:
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
                raise ValueError("not a call with keyword arguments")
            args = {kw.arg: _literal(kw.value) for kw in node.keywords}
            out.append(ToolCall(node.func.id, json.dumps(args, ensure_ascii=False)))
        return out

    def call_regex(self, function: dict[str, Any]) -> str:
        """name(k=v, ...) over the required parameters in their declared order, each value a
        JSON value of its schema (the parser reads JSON's true/false/null too)."""
        params = _parameters(function)
        props = params.get("properties", {})
        pairs = [f"{escape(k)}={schema_to_regex(props.get(k, {})).regex}" for k in params.get("required", [])]
        return escape(function["name"]) + r"\(" + ", ".join(pairs) + r"\)"

    def section(self, call: str, most: int) -> str:
        return r"\[" + call + (f"(?:, {call}){{0,{most - 1}}}" if most > 1 else "") + r"\]"


_JSON_NAMES = {"true": True, "false": False, "null": None}
_DECODER = json.JSONDecoder()
_SPACE = " \t\n\r"


def _read_object(text: str, at: int) -> tuple[dict[str, tuple[int, int, Any, bool]], int | None]:
    """The members of the JSON object at text[at] as far as the text goes: key -> (value
    start, value end, value, complete), and the end of the object (None if it is cut short;
    the last member's value then runs to the end of the text)."""
    members: dict[str, tuple[int, int, Any, bool]] = {}
    pos = at + 1
    while True:
        pos = _skip(text, pos)
        if pos >= len(text):
            return members, None
        if text[pos] == "}":
            return members, pos + 1
        try:
            key, pos = _DECODER.raw_decode(text, pos)
        except json.JSONDecodeError:
            return members, None
        pos = _skip(text, pos)
        if not text.startswith(":", pos):
            return members, None
        start = _skip(text, pos + 1)
        try:
            value, pos = _DECODER.raw_decode(text, start)
        except json.JSONDecodeError:
            if start < len(text):
                members[str(key)] = (start, len(text), None, False)
            return members, None
        members[str(key)] = (start, pos, value, True)
        pos = _skip(text, pos)
        if text.startswith(",", pos):
            pos += 1


def _skip(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in _SPACE:
        pos += 1
    return pos


def _literal(node: ast.expr | None) -> Any:
    """A Python literal, with JSON's true / false / null read as names."""
    if node is None:  # the key of a `**mapping` entry in a dict display
        raise ValueError("malformed node or string: None")
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, ast.List):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values)}
    return ast.literal_eval(node)


def _parameters(function: dict[str, Any]) -> dict[str, Any]:
    params = function.get("parameters")
    return params if isinstance(params, dict) and params else {"type": "object", "properties": {}}


PARSERS: dict[str, type[ToolParser]] = {
    "qwen25": Qwen25Parser,
    "llama3": Llama3Parser,
    "mistral": MistralParser,
    "pythonic": PythonicParser,
}
