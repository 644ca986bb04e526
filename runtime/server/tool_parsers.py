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
    arguments: str  # a JSON object's text


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

    def forced(self, functions: list[dict[str, Any]], parallel: bool) -> str:
        """Regex of an answer that is only calls to `functions` (one, or up to
        MAX_PARALLEL_CALLS when parallel), each call's arguments valid for its parameters."""
        one = alternation([self.call_regex(f) for f in functions])
        return self.section(one, MAX_PARALLEL_CALLS if parallel else 1)

    def call_regex(self, function: dict[str, Any]) -> str:
        schema = {"type": "object", "properties": {"name": {"const": function["name"]},
                                                   self.args_key: _parameters(function)},
                  "required": ["name", self.args_key], "additionalProperties": False}
        return schema_to_regex(schema).regex

    def section(self, call: str, most: int) -> str:
        raise NotImplementedError

    def _json_call(self, obj: Any) -> ToolCall:
        args = obj.get(self.args_key, obj.get("arguments", obj.get("parameters", {})))
        if not isinstance(obj.get("name"), str) or not isinstance(args, dict):
            raise ValueError("not a tool call")
        return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


class Qwen25Parser(ToolParser):
    start = "<tool_call>"
    end = "</tool_call>"

    def calls(self, section: str) -> list[ToolCall]:
        out = []
        for block in section.split(self.start)[1:]:
            body, closed, _ = block.partition(self.end)
            if not closed and out:
                break  # a last block cut short (max_tokens) is dropped
            out.append(self._json_call(json.loads(body)))
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
            obj, pos = decoder.raw_decode(section, pos)
            out.append(self._json_call(obj))
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
        items = json.loads(section.removeprefix(self.start).strip())
        if not isinstance(items, list):
            items = [items]
        return [self._json_call(obj) for obj in items]

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


def _literal(node: ast.expr) -> Any:
    """A Python literal, with JSON's true / false / null read as names."""
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


PARSERS: dict[str, type[ToolParser]] = {"qwen25": Qwen25Parser, "llama3": Llama3Parser, "mistral": MistralParser,
                                        "pythonic": PythonicParser}
