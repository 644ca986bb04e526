"""Nesting limits, checked before anything recurses. Python's json and re parsers, msgspec and
Arbor's schema compiler recurse once per level of their input, so a request nested thousands
deep would end in RecursionError; these scans count levels without recursing or parsing."""

from __future__ import annotations

import json
import re

import numpy as np

from arbor.grammar.linear_regex import scanner

MAX_DEPTH = 64  # levels of arrays and objects in JSON, of groups in a regex
_PATH_PARTS = 8  # a too-deep path is named down to this many keys or indices
_STRING = scanner(rb'(?s)"[^"\\]*(?:\\.[^"\\]*)*"')  # RE2: a body of '"\\' pairs is quadratic on re
_REGEX_ESCAPE = re.compile(r"\\.", re.S)
_REGEX_CLASS = scanner(r"\[\^?\]?[^\]]*\]")  # after escapes are gone: no "]" inside but a first one


class TooDeep(ValueError):
    """Input nested past its limit; the message names the field, the depth and the limit."""

    def __init__(self, field: str, what: str, depth: int, limit: int) -> None:
        super().__init__(f"{field} nests {what} {depth} levels deep; the limit is {limit}: flatten it")
        self.depth, self.limit = depth, limit


def _steps(opens: bytes, closes: bytes) -> np.ndarray:
    table = np.zeros(256, np.int8)
    table[list(opens)], table[list(closes)] = 1, -1
    return table


_JSON_STEPS = _steps(b"[{", b"]}")
_REGEX_STEPS = _steps(b"(", b")")
_NOT_JSON_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")


def json_depth(text: str | bytes) -> int:
    """How deep the arrays and objects of JSON `text` nest (string contents skipped)."""
    data = text.encode() if isinstance(text, str) else text
    return _depth(_STRING.sub(b"", data).translate(None, _NOT_JSON_BRACKETS), _JSON_STEPS)


def regex_depth(pattern: str) -> int:
    """How deep the groups of `pattern` nest (escaped parentheses and character classes skipped)."""
    plain = _REGEX_CLASS.sub("", _REGEX_ESCAPE.sub("", pattern))
    return _depth(plain.encode(), _REGEX_STEPS)


def check_json(text: str | bytes, field: str, limit: int = MAX_DEPTH) -> None:
    """Raise TooDeep (a ValueError) naming `field` when JSON `text` nests deeper than `limit`."""
    opens = text.count("[") + text.count("{") if isinstance(text, str) else text.count(b"[") + text.count(b"{")
    if opens > limit and (depth := json_depth(text)) > limit:
        raise TooDeep(field, "arrays and objects", depth, limit)


def check_regex(pattern: str, field: str, limit: int = MAX_DEPTH) -> None:
    """Raise TooDeep (a ValueError) naming `field` when the groups of `pattern` nest deeper than `limit`."""
    if pattern.count("(") > limit and (depth := regex_depth(pattern)) > limit:
        raise TooDeep(field, "groups", depth, limit)


def too_deep_path(data: bytes, limit: int = MAX_DEPTH) -> str:
    """Where JSON `data` first nests past `limit`, as a path ("messages[0].content"); "" when it
    does not, or when its text is too broken to say."""
    b = np.frombuffer(data, np.uint8)
    at_ = np.arange(len(b), dtype=np.int32)
    plain_before = np.maximum.accumulate(np.where(b == ord("\\"), -1, at_))
    escaped = np.zeros(len(b), bool)
    escaped[1:] = (at_[:-1] - plain_before[:-1]) % 2 == 1  # after an odd run of backslashes
    quote = (b == ord('"')) & ~escaped
    outside = (np.cumsum(quote) % 2 == 0) & ~quote
    depth = np.cumsum(_JSON_STEPS[b] * outside, dtype=np.int32)
    if depth.max(initial=0) <= limit:
        return ""
    end = int(np.argmax(depth > limit))
    parts: list[str] = []
    try:
        for level in range(1, min(limit, _PATH_PARTS) + 1):
            here = (depth[:end] == level) & outside[:end]
            start = int(np.flatnonzero(here & (_JSON_STEPS[b[:end]] == 1))[-1])
            if b[start] == ord("["):
                parts.append(f"[{np.count_nonzero(here[start:] & (b[start:end] == ord(',')))}]")
                continue
            colon = start + int(np.flatnonzero(here[start:] & (b[start:end] == ord(":")))[-1])
            quotes = np.flatnonzero(quote[start:colon]) + start
            parts.append("." + str(json.loads(data[quotes[-2] : quotes[-1] + 1])))
    except (IndexError, ValueError):  # not JSON where it matters: name what was found
        pass
    return "".join(parts).lstrip(".")


def _depth(brackets: bytes, steps: np.ndarray) -> int:
    if not brackets:
        return 0
    return int(np.cumsum(steps[np.frombuffer(brackets, np.uint8)], dtype=np.int32).max(initial=0))
