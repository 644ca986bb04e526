"""User-supplied regexes on RE2: matching time linear in the text, whatever the pattern.

Python's `re` backtracks: an eight-character pattern such as `(a+)+$` takes exponential time
on a text the request itself can force, and stalls the process that runs it. Every regex a
user supplies that Arbor runs on text (stop regexes, schema patterns checked after
generation) compiles here, and a pattern RE2 cannot run is refused with a reason.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import re2

MAX_PROGRAM_BYTES = 1 << 20  # RE2's memory budget per pattern; bounds compile time (~20 ms) and memory
# RE2 compiles in about 0.25 us per program instruction, on the server's event loop: one
# request's patterns may have this many in all (~50 ms), however many it sends.
MAX_REQUEST_PROGRAM = 200_000
_ECMA_ESCAPE = re.compile(r"\\u([0-9A-Fa-f]{4})|\\.", re.S)  # fixed, linear: one escape at a time


def _options() -> Any:
    options = re2.Options()
    options.log_errors = False  # a refused pattern is the user's error, reported in the 400
    options.max_mem = MAX_PROGRAM_BYTES
    return options


_OPTIONS = _options()


@functools.lru_cache(maxsize=64)
def _compile(pattern: str) -> Any:
    return re2.compile(pattern, _OPTIONS)


def compile_linear(pattern: str, name: str) -> Any:
    """`pattern` compiled by RE2; raises ValueError naming `name` (the request field) and
    saying what to change when RE2 cannot run it."""
    try:
        return _compile(pattern)
    except re2.error as exc:
        raise ValueError(f"{name} {pattern[:80]!r} {_why(pattern, exc)}") from None


def scanner(pattern: str | bytes) -> Any:
    """One of Arbor's own patterns on RE2, to scan user text: on Python's `re` even a fixed
    pattern can take time quadratic in the text (each failed start rescans the rest). A bytes
    pattern scans bytes, one byte a character (Latin-1)."""
    options = re2.Options()
    if isinstance(pattern, bytes):
        options.encoding = re2.Options.Encoding.LATIN1
    return re2.compile(pattern, options)


class ProgramBudget:
    """The RE2 program instructions one request may still compile (MAX_REQUEST_PROGRAM in all)."""

    def __init__(self, limit: int = MAX_REQUEST_PROGRAM) -> None:
        self.left = limit

    def take(self, regex: Any, name: str) -> None:
        """Charge a compiled regex; raises ValueError naming `name` once the budget is spent."""
        self.left -= regex.programsize
        if self.left < 0:
            raise ValueError(
                f"{name}: the request's regexes compile to more than {MAX_REQUEST_PROGRAM:,} "
                "RE2 instructions in all; use fewer patterns, smaller counted repeats {n} "
                "or narrower character classes"
            )


def compile_ecma(pattern: str, name: str) -> Any:
    """A JSON Schema (ECMA-262) `pattern` compiled by RE2: `\\uXXXX` escapes become RE2's `\\x{XXXX}`."""
    spelled = _ECMA_ESCAPE.sub(lambda m: f"\\x{{{m.group(1)}}}" if m.group(1) else m.group(0), pattern)
    return compile_linear(spelled, name)


def _why(pattern: str, exc: re2.error) -> str:
    raw = exc.args[0] if exc.args else ""
    message = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
    if "too large" in message:
        return (
            "is too large for the linear-time regex engine (RE2); simplify it: fewer or smaller "
            "counted repeats {n}, narrower character classes"
        )
    if "repetition size" in message:
        return f"is not supported: {message}; RE2 allows counted repeats up to {{1000}}"
    try:
        re.compile(pattern)  # compiled only, never run: does a backtracking engine take it?
    except (re.error, RecursionError, OverflowError):
        return f"is not a valid regular expression: {message}"
    return (
        f"is not supported: {message}; lookaround, backreferences, atomic groups and possessive "
        "repeats need a backtracking engine, which Arbor does not run on user patterns; rewrite without them"
    )


def check_schema_patterns(schema: Any) -> None:
    """Refuse a JSON Schema whose `pattern` or `patternProperties` RE2 cannot run, or whose
    `unevaluatedProperties` check would run `patternProperties` on Python's backtracking `re`
    (jsonschema's own code, which no keyword hook reaches). Every object in the document
    counts, since a `$ref` can make any of them a schema. Iterative: any nesting depth."""
    todo, patterned, unevaluated = [schema], False, False
    seen: set[str] = set()
    budget = ProgramBudget()

    def check(pattern: str, name: str) -> None:
        if pattern not in seen:
            seen.add(pattern)
            budget.take(compile_ecma(pattern, name), name)

    while todo:
        node = todo.pop()
        if isinstance(node, list):
            todo.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        if isinstance(node.get("pattern"), str):
            check(node["pattern"], "json_schema pattern")
        if isinstance(node.get("patternProperties"), dict):
            patterned = True
            for key in node["patternProperties"]:
                check(key, "json_schema patternProperties key")
        unevaluated = unevaluated or "unevaluatedProperties" in node
        todo.extend(node.values())
    if patterned and unevaluated:
        raise ValueError(
            "json_schema: unevaluatedProperties together with patternProperties is not supported "
            "(its check would run the patterns on a backtracking regex engine); use "
            "additionalProperties beside patternProperties instead"
        )
