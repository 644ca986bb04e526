"""The DSL's expressions: what `s += ...` appends to a program state.

`"text" + gen("x")` builds an ExprList; the interpreter runs the pieces in order. The
REGEX_* constants are the patterns behind `gen(dtype=...)` (bounded, so a model that never
stops still ends).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

REGEX_INT = r"-?(0|[1-9][0-9]{0,17})"
REGEX_FLOAT = r"-?(0|[1-9][0-9]{0,15})(\.[0-9]{1,15})?"
REGEX_BOOL = r"(True|False)"
REGEX_STR = r'"[A-Za-z0-9 ,.:;!?()_\'-]{0,64}"'
DTYPE_REGEX = {int: REGEX_INT, float: REGEX_FLOAT, bool: REGEX_BOOL, str: REGEX_STR}


class Expr:
    """Anything a program state takes; `+` chains expressions (strings become Text)."""

    def __add__(self, other: Any) -> ExprList:
        return ExprList([self, as_expr(other)])

    def __radd__(self, other: Any) -> ExprList:
        return ExprList([as_expr(other), self])


@dataclass
class ExprList(Expr):
    """Expressions run in order."""

    items: list[Expr]

    def __add__(self, other: Any) -> ExprList:
        return ExprList([*self.items, as_expr(other)])

    def __radd__(self, other: Any) -> ExprList:
        return ExprList([as_expr(other), *self.items])


@dataclass
class Text(Expr):
    """Literal text appended to the state."""

    text: str


@dataclass
class SamplingParams:
    """Per-call generation options; None = the program's default (run(...) keywords)."""

    max_new_tokens: int | None = None
    min_new_tokens: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool | None = None
    seed: int | None = None
    regex: str | None = None
    json_schema: str | None = None

    def merged(self, defaults: SamplingParams) -> dict[str, Any]:
        """The native API's sampling_params: these values over `defaults`, Nones dropped."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            value = getattr(defaults, f.name) if value is None else value
            if value is not None:
                out[f.name] = value
        return out


@dataclass
class Gen(Expr):
    """Generate into variable `name` (None: unnamed)."""

    name: str | None
    params: SamplingParams
    return_logprob: bool = False
    top_logprobs_num: int = 0


@dataclass
class Select(Expr):
    """Pick one of `choices` by likelihood into `name`."""

    name: str | None
    choices: list[str]
    temperature: float = 0.0
    choices_method: str = "token_length_normalized"


@dataclass
class RoleBegin(Expr):
    """Start of a chat message."""

    role: str


@dataclass
class RoleEnd(Expr):
    """End of a chat message."""

    role: str


@dataclass
class VarScopeBegin(Expr):
    """Start of text captured as variable `name`."""

    name: str


@dataclass
class VarScopeEnd(Expr):
    """End of that capture."""

    name: str


def as_expr(value: Any) -> Expr:
    """Strings (and anything printable) become Text; expressions pass through."""
    if isinstance(value, Expr):
        return value
    return Text(str(value))


def flatten(expr: Expr) -> list[Expr]:
    """The leaves of nested ExprLists, in order."""
    if isinstance(expr, ExprList):
        return [leaf for item in expr.items for leaf in flatten(item)]
    return [expr]
