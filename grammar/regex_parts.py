"""Regex pieces for JSON text: strings, numbers and integer ranges, formats, escaped literals,
and JSON-Schema `pattern` translation. The dialect is the common subset of Rust's `regex`
(what outlines-core compiles) and Python's `re`: no lookaround, no backreferences.
"""

from __future__ import annotations

import json
from typing import Any

from arbor.grammar.nesting import TooDeep, check_regex

# One character of a JSON string: any but quote, backslash and control bytes, or an escape.
STRING_CHAR = r'(?:[^"\\\x00-\x1F]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})'
STRING = f'"{STRING_CHAR}*"'
# Keys of additionalProperties maps are bounded, so a model that never closes a quote still
# ends. (Not inside json_object / `{}` values, nor around an unanchored `pattern`: bounded
# strings there multiply the automaton and its compile time by 5 to 50.)
FREE_KEY = f'"{STRING_CHAR}{{0,32}}"'
# Digits are bounded (16 before the point, 16 after, 3 in an exponent): a narrower language,
# never a wrong one, and it keeps a model that cannot stop from writing numbers forever.
MAX_DIGITS = 16
INTEGER = r"-?(?:0|[1-9][0-9]{0,15})"
FRACTION = r"(?:\.[0-9]{1,16})?"
NUMBER = INTEGER + FRACTION + r"(?:[eE][+-]?[0-9]{1,3})?"
BOOLEAN = "(?:true|false)"
NULL = "null"
ITEM_SEP = ", "
KEY_SEP = ": "

# Short counted repetitions: each count costs DFA states, yet unbounded ones let a model that
# never stops write one e-mail address forever.
_LABEL = "[a-zA-Z0-9]{1,24}"
_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_DATE = "[0-9]{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])"
_TIME = r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,6})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
# String contents (without the quotes) for common `format`s; short and DFA-friendly on purpose.
FORMATS = {
    "date-time": f"{_DATE}T{_TIME}",
    "date": _DATE,
    "time": _TIME,
    "email": r"[a-zA-Z0-9_%+-]{1,24}@" + f"{_LABEL}(?:\\.{_LABEL}){{0,2}}" + r"\.[a-z]{2,6}",
    "hostname": f"{_LABEL}(?:\\.{_LABEL}){{0,3}}",
    "ipv4": f"{_OCTET}(?:\\.{_OCTET}){{3}}",
    "uuid": "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    "uri": r"https?://" + f"{_LABEL}(?:\\.{_LABEL}){{0,2}}" + r"(?:/[a-zA-Z0-9._~-]{0,16}){0,3}",
}
_META = set("\\.+*?()|[]{}^$#&-~")


class SchemaError(ValueError):
    """A constraint Arbor cannot compile; the message says what to change."""


def escape(text: str) -> str:
    """A regex matching `text` literally."""
    out = []
    for c in text:
        if c in _META:
            out.append("\\" + c)
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append(f"\\x{ord(c):02X}")
        else:
            out.append(c)
    return "".join(out)


def json_literal(value: Any) -> str:
    """A regex matching exactly the JSON text Arbor writes for `value`."""
    return escape(json.dumps(value, ensure_ascii=False, separators=(ITEM_SEP, KEY_SEP)))


def alternation(parts: list[str]) -> str:
    """`(?:a|b|...)`, or the single part; duplicates dropped, order kept."""
    unique = list(dict.fromkeys(parts))
    return unique[0] if len(unique) == 1 else "(?:" + "|".join(unique) + ")"


def repeat(item: str, low: int, high: int | None) -> str:
    """`item{low,high}` separated by ", " (high None = unbounded)."""
    if high is not None and high <= 0:
        return ""
    tail_low = max(low - 1, 0)
    tail = f"{{{tail_low},}}" if high is None else f"{{{tail_low},{high - 1}}}"
    tail = {"{0,}": "*", "{1,}": "+", "{0,0}": ""}.get(tail, tail)
    body = item + (f"(?:{ITEM_SEP}{item}){tail}" if tail != "" else "")
    return body if low >= 1 else f"(?:{body})?"


# --------------------------------------------------------------- integer ranges


def int_range(low: int | None, high: int | None) -> str:
    """Canonical decimal integers in [low, high] (None = unbounded)."""
    if low is not None and high is not None and low > high:
        raise SchemaError(f"minimum {low} is above maximum {high}; no integer satisfies both")
    parts = []
    if low is None or low < 0:  # negative side: -m for m in [neg_low, neg_high]
        neg_low = 1 if high is None or high >= 0 else -high
        neg_high = None if low is None else -low
        if neg_high is None or neg_high >= neg_low:
            parts.append("-" + _natural_range(neg_low, neg_high))
    if high is None or high >= 0:
        parts.append(_natural_range(0 if low is None or low < 0 else low, high))
    return alternation(parts)


def _natural_range(low: int, high: int | None) -> str:
    if high is None:
        k = len(str(low))
        if k >= MAX_DIGITS:
            return _natural_range(low, 10**k - 1)
        return alternation([_natural_range(low, 10**k - 1), f"[1-9][0-9]{{{k},{MAX_DIGITS - 1}}}"])
    parts = []
    for k in range(len(str(low)), len(str(high)) + 1):
        lo = max(low, 10 ** (k - 1) if k > 1 else 0)
        hi = min(high, 10**k - 1)
        if lo <= hi:
            parts += _same_length(str(lo), str(hi))
    return alternation(parts)


def _same_length(lo: str, hi: str) -> list[str]:
    """Regexes covering the digit strings from lo to hi, both of one length."""
    if lo == hi:
        return [lo]
    n = len(lo) - 1
    if lo[1:] == "0" * n and hi[1:] == "9" * n:
        first = lo[0] if lo[0] == hi[0] else f"[{lo[0]}-{hi[0]}]"
        return [first + (f"[0-9]{{{n}}}" if n > 1 else "[0-9]" * n)]
    if lo[0] == hi[0]:
        return [lo[0] + r for r in _same_length(lo[1:], hi[1:])]
    out = [lo[0] + r for r in _same_length(lo[1:], "9" * n)]
    a, b = int(lo[0]) + 1, int(hi[0]) - 1
    if a <= b:
        out.append((str(a) if a == b else f"[{a}-{b}]") + (f"[0-9]{{{n}}}" if n > 1 else "[0-9]"))
    return out + [hi[0] + r for r in _same_length("0" * n, hi[1:])]


def bounded_number(low: int | None, high: int | None, high_exclusive: bool = False) -> str:
    """JSON numbers (no exponent) in [low, high], or [low, high) with high_exclusive, for
    integral bounds. An exclusive bound at or below zero is taken as inclusive (the caller
    has the output validated then)."""
    if low is not None and high is not None and (low > high or (high_exclusive and low == high)):
        raise SchemaError(f"minimum {low} and maximum {high} leave no number; widen the range")
    parts = []
    if low is None or low < 0:  # x = -m
        neg_high = None if low is None else -low
        parts.append("-" + _span(0 if high is None or high >= 0 else -high, neg_high, True))
    if high is None or high > 0 or (high == 0 and not high_exclusive):
        parts.append(_span(0 if low is None or low < 0 else low, high, not high_exclusive))
    return alternation(parts)


def _span(low: int, high: int | None, include_high: bool) -> str:
    """Unsigned decimals in [low, high), plus exactly `high` when include_high."""
    parts = []
    if high is None or high > low:
        parts.append(_natural_range(low, None if high is None else high - 1) + FRACTION)
    if include_high and high is not None:
        parts.append(f"{high}(?:\\.0+)?")
    return alternation(parts)


# ------------------------------------------------------------ pattern keyword

_CLASS_SHORT = {"d": "0-9", "w": "0-9A-Za-z_", "s": " "}
_OUTSIDE_SHORT = {
    "d": "[0-9]",
    "w": "[0-9A-Za-z_]",
    "s": "[ ]",
    "D": r'[^"\\\x00-\x1F0-9]',
    "W": r'[^"\\\x00-\x1F0-9A-Za-z_]',
    "S": r'[^"\\\x00-\x20]',
}


def pattern_contents(pattern: str) -> str:
    """Regex over the JSON-escaped contents of a string matching `pattern` (ECMA-262 style,
    unanchored unless it starts with ^ / ends with $). Characters JSON must escape are kept
    out of character classes, which narrows but never breaks the language."""
    if not isinstance(pattern, str):
        raise SchemaError("pattern must be a string")
    try:
        check_regex(pattern, "pattern")  # compilers that parse regexes recursively come after
    except TooDeep as exc:
        raise SchemaError(str(exc)) from None
    for bad in ("(?=", "(?!", "(?<=", "(?<!"):
        if bad in pattern:
            raise SchemaError(f"pattern {pattern!r} uses lookaround ({bad}), which constrained decoding cannot express")
    body = pattern
    start = body.startswith("^")
    end = body.endswith("$") and not body.endswith("\\$")
    body = body[1 if start else 0 : len(body) - 1 if end else len(body)]
    out, i, in_class = [], 0, False
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            i += 2
            if nxt.isdigit() and nxt != "0":
                raise SchemaError(
                    f"pattern {pattern!r} uses a backreference, which constrained decoding cannot express"
                )
            if nxt == "u" and body[i : i + 4].isalnum() and len(body[i : i + 4]) == 4:
                out.append(f"\\x{{{body[i : i + 4]}}}")
                i += 4
            elif in_class and nxt in _CLASS_SHORT:
                out.append(_CLASS_SHORT[nxt])
            elif not in_class and nxt in _OUTSIDE_SHORT:
                out.append(_OUTSIDE_SHORT[nxt])
            elif nxt in '"\\':
                out.append("" if in_class else escape("\\" + nxt))
            elif nxt == "/":
                out.append("/")
            else:
                out.append("\\" + nxt)
            continue
        if in_class:
            if c == "]":
                in_class = False
            if c not in '"':
                out.append(c)
        elif c == "[":
            in_class = True
            negated = body[i + 1 : i + 2] == "^"
            out.append("[^" + '"\\\\\\x00-\\x1F' if negated else "[")
            i += 1 if negated else 0
        elif c == ".":
            out.append(r'[^"\\\x00-\x1F]')
        elif c == '"':
            out.append(escape('\\"'))
        else:
            out.append(c)
        i += 1
    free = f"{STRING_CHAR}*"
    return ("" if start else free) + "(?:" + "".join(out) + ")" + ("" if end else free)


def infer_type(s: dict) -> list[str]:
    """The JSON type a schema without `type` describes, read from its keywords."""
    if any(k in s for k in ("properties", "required", "additionalProperties", "patternProperties")):
        return ["object"]
    if any(k in s for k in ("items", "prefixItems", "minItems", "maxItems")):
        return ["array"]
    if any(k in s for k in ("pattern", "format", "minLength", "maxLength")):
        return ["string"]
    if any(k in s for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")):
        return ["number"]
    return ["any"]
