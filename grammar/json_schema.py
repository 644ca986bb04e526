"""JSON Schema -> one regex over the JSON text Arbor generates.

The text is compact and canonical (`, ` and `: ` separators, properties in schema order), so
most positions admit one continuation and jump-forward can write it. Keywords a regex
cannot express (uniqueItems, non-integral bounds, ...) are listed in
`RegexPlan.unenforced`: the engine validates such outputs with `jsonschema` and says so.
Where a schema allows an instance the regex cannot reach within its limits (recursion
deeper than MAX_REF_DEPTH, huge optional-property sets), the regex picks the instances it
can reach: every output still validates.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from arbor.grammar.one_of import exclusive
from arbor.grammar.regex_parts import (
    BOOLEAN,
    FORMATS,
    FREE_KEY,
    INTEGER,
    ITEM_SEP,
    KEY_SEP,
    NULL,
    NUMBER,
    STRING,
    STRING_CHAR,
    SchemaError,
    alternation,
    bounded_number,
    escape,
    infer_type,
    int_range,
    json_literal,
    pattern_contents,
    repeat,
)

MAX_REF_DEPTH = 2  # expansions of one $ref on the path; deeper recursion is cut off
MAX_REF_NESTING = 10  # $ref expansions on the path in all
MAX_WORK_CHARS = 4_000_000  # regex text built in all, intermediate pieces included
ANY_DEPTH = 2  # nesting of values an unconstrained schema ({} or true) may generate
MAX_EXACT_REPEAT = 64  # larger maxLength / maxItems are left unbounded (and validated after)
# Compile time grows with the automaton, which grows with the regex: above TARGET_CHARS the
# schema is rebuilt with ever smaller per-object budgets, dropping the biggest optional
# properties first (outputs stay valid; they just never contain those properties).
TARGET_CHARS = 16_000
OBJECT_BUDGETS = (16_000, 8_000, 4_000, 2_000, 1_000, 0)
MAX_REGEX_CHARS = 2_000_000
_TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")


class _TooMuchWork(SchemaError):
    """Building the regex takes too long at this object budget."""


@dataclass
class RegexPlan:
    """The regex of a schema and the keywords it does not enforce."""

    regex: str
    unenforced: list[str] = field(default_factory=list)
    dropped_optional: int = 0  # optional properties left out to keep the automaton small


def schema_to_regex(schema: Any) -> RegexPlan:
    """Compile a JSON Schema (dict or bool) to a regex; raises SchemaError naming the problem."""
    try:
        return _schema_to_regex(schema)
    except SchemaError:
        raise
    except Exception:  # the builder takes the schema's shape on trust: say what is malformed
        problem = _metaschema_problem(schema)
        if problem is None:
            raise  # a valid schema the builder fails on is Arbor's bug
        raise SchemaError(f"the schema is not valid JSON Schema: {problem}") from None


def _metaschema_problem(schema: Any) -> str | None:
    """How `schema` breaks its draft's metaschema (without compiling its regexes), or None."""
    import jsonschema

    try:
        # types-jsonschema's Validator protocol lacks check_schema's format_checker (jsonschema has it)
        validator = jsonschema.validators.validator_for(schema)
        validator.check_schema(schema, format_checker=None)  # type: ignore[call-arg]
    except jsonschema.SchemaError as exc:
        where = "/".join(map(str, exc.path)) or "the top"
        return f"{exc.message[:200]} (at {where})"
    return None


def _schema_to_regex(schema: Any) -> RegexPlan:
    for budget in OBJECT_BUDGETS:
        builder = _Builder(schema, budget)
        try:
            regex = builder.value(schema, 0)
        except _TooMuchWork:
            if budget == OBJECT_BUDGETS[-1]:
                raise
            continue
        if regex is None or len(regex) <= TARGET_CHARS:
            break
    if regex is None:
        raise SchemaError("the schema admits no JSON value Arbor can generate (false, or endless recursion)")
    if len(regex) > MAX_REGEX_CHARS:
        raise SchemaError(
            f"the schema compiles to a {len(regex):,}-character regex (limit {MAX_REGEX_CHARS:,}); "
            "simplify it or bound its optional parts"
        )
    return RegexPlan(regex, sorted(builder.unenforced), builder.dropped)


def any_json_regex(depth: int = 0, top_object: bool = False) -> str:
    """Any JSON value nested at most ANY_DEPTH - depth levels (an object if top_object)."""
    scalar = alternation([STRING, NUMBER, BOOLEAN, NULL])
    if depth >= ANY_DEPTH:
        return scalar
    inner = any_json_regex(depth + 1)
    array = r"\[" + repeat(inner, 0, None) + r"\]"
    obj = r"\{" + repeat(STRING + KEY_SEP + inner, 0, None) + r"\}"
    return obj if top_object else alternation([scalar, array, obj])


class _Builder:
    def __init__(self, root: Any, object_budget: int) -> None:
        self.root = root
        self.object_budget = object_budget
        self.dropped = 0
        self.unenforced: set[str] = set()
        self.ref_stack: list[str] = []
        self.work = 0
        self.cuts = 0  # recursion cut-offs so far; a $ref expanded without one is memoised
        self.memo: dict[tuple[str, int], str | None] = {}

    def value(self, s: Any, depth: int) -> str | None:
        """Regex of the values `s` admits, or None when it admits none this builder reaches."""
        regex = self._value(s, depth)
        self.work += len(regex or "")
        if self.work > MAX_WORK_CHARS:
            raise _TooMuchWork(
                f"the schema expands past {MAX_WORK_CHARS:,} regex characters; "
                "simplify it (fewer nested $ref / anyOf combinations)"
            )
        return regex

    def _value(self, s: Any, depth: int) -> str | None:
        if s is True or s == {}:
            return any_json_regex(min(depth, ANY_DEPTH))
        if s is False:
            return None
        if not isinstance(s, dict):
            raise SchemaError(f"a schema must be an object or a boolean, got {json.dumps(s)[:60]}")
        if "$ref" in s:
            return self._ref(s, depth)
        if "allOf" in s:
            merged = dict(s)
            parts = merged.pop("allOf")
            for part in parts:
                merged = self._merge(merged, self._resolve_all(part))
            return self.value(merged, depth)
        for key in ("anyOf", "oneOf"):
            if key in s:
                base = {k: v for k, v in s.items() if k != key}
                parts = [self._merge(base, self._resolve_all(b)) if base else b for b in s[key]]
                if key == "oneOf" and len(parts) > 1:
                    parts = exclusive(parts, self._resolve_all)  # narrowed: no output matches two branches
                branches = [self.value(part, depth) for part in parts]
                kept = [b for b in branches if b is not None]
                return alternation(kept) if kept else None
        if "not" in s:
            if s["not"] in ({}, True):
                return None
            self.unenforced.add("not")
        for key in _CONDITIONAL:  # checked after generation, never silently dropped
            if key in s:
                self.unenforced.add(key)
        if "const" in s:
            return json_literal(s["const"])
        if "enum" in s:
            values = s["enum"]
            if not isinstance(values, list) or not values:
                raise SchemaError("enum must be a non-empty list")
            return alternation([json_literal(v) for v in values])
        types = s.get("type", infer_type(s))
        if isinstance(types, str):
            types = [types]
        kept = [r for r in (self._typed(t, s, depth) for t in dict.fromkeys(types)) if r is not None]
        return alternation(kept) if kept else None

    def _typed(self, kind: str, s: dict, depth: int) -> str | None:
        if kind == "any":
            return any_json_regex(min(depth, ANY_DEPTH))
        if kind not in _TYPES:
            raise SchemaError(f"unknown type {kind!r}; use one of {', '.join(_TYPES)}")
        if kind == "string":
            return self._string(s)
        if kind == "integer":
            return self._integer(s)
        if kind == "number":
            return self._number(s)
        if kind == "boolean":
            return BOOLEAN
        if kind == "null":
            return NULL
        if kind == "array":
            return self._array(s, depth)
        return self._object(s, depth)

    # ------------------------------------------------------------ scalars

    def _string(self, s: dict) -> str:
        if "pattern" in s:
            if "minLength" in s or "maxLength" in s:
                self.unenforced.add("minLength/maxLength with pattern")
            return f'"{pattern_contents(s["pattern"])}"'
        fmt = s.get("format")
        if fmt in FORMATS:
            return f'"{FORMATS[fmt]}"'
        low, high = self._count_bounds(s, "minLength", "maxLength")
        if low == 0 and high is None:
            return STRING
        reps = f"{{{low},}}" if high is None else f"{{{low},{int(high)}}}"
        return f'"{STRING_CHAR}{reps}"'

    def _count_bounds(self, s: dict, low_key: str, high_key: str) -> tuple[int, int | None]:
        """(min, max) of a length keyword pair; a max above MAX_EXACT_REPEAT is left
        unbounded and listed as unenforced."""
        low = int(s.get(low_key, 0))
        high = s.get(high_key)
        if high is not None and int(high) < low:
            raise SchemaError(f"{high_key} {high} is below {low_key} {low}")
        if high is not None and high > MAX_EXACT_REPEAT:
            self.unenforced.add(high_key)
            high = None
        return low, None if high is None else int(high)

    def _bounds(self, s: dict) -> tuple[float | None, float | None, bool, bool]:
        """(low, high, low exclusive, high exclusive) in draft-4 and draft-6+ spellings."""
        low, high = s.get("minimum"), s.get("maximum")
        low_x = high_x = False
        for key, is_low in (("exclusiveMinimum", True), ("exclusiveMaximum", False)):
            v = s.get(key)
            if isinstance(v, bool):  # draft 4: a flag on minimum / maximum
                low_x, high_x = (v, high_x) if is_low else (low_x, v)
            elif isinstance(v, (int, float)):
                if is_low:
                    low, low_x = v, True
                else:
                    high, high_x = v, True
        for name, v in (("minimum", low), ("maximum", high)):
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v)):
                raise SchemaError(f"the {name} bound must be a finite number, got {v!r}")
        return low, high, low_x, high_x

    def _integer(self, s: dict) -> str:
        low, high, low_x, high_x = self._bounds(s)
        if "multipleOf" in s:
            self.unenforced.add("multipleOf")
        if low is None and high is None:
            return INTEGER
        lo = None if low is None else (math.floor(low) + 1 if low_x else math.ceil(low))
        hi = None if high is None else (math.ceil(high) - 1 if high_x else math.floor(high))
        return int_range(lo, hi)

    def _number(self, s: dict) -> str:
        low, high, low_x, high_x = self._bounds(s)
        if "multipleOf" in s:
            self.unenforced.add("multipleOf")
        if low is None and high is None:
            return NUMBER
        integral = all(b is None or float(b).is_integer() for b in (low, high))
        if not integral or low_x or (high_x and high is not None and high <= 0):
            self.unenforced.add("minimum/maximum")
        lo = None if low is None else math.floor(low)
        hi = None if high is None else math.ceil(high)
        return bounded_number(lo, hi, high_x and integral and hi is not None and hi > 0)

    # ------------------------------------------------------------ containers

    def _array(self, s: dict, depth: int) -> str | None:
        for key in ("uniqueItems", "contains"):
            if s.get(key):
                self.unenforced.add(key)
        prefix = s.get("prefixItems")
        rest = s.get("items", True)
        if isinstance(rest, list):  # draft 4 tuple form
            prefix, rest = rest, s.get("additionalItems", True)
        low, high = self._count_bounds(s, "minItems", "maxItems")
        fixed: list[str] = []
        for i, sub in enumerate(prefix or []):
            if high is not None and i >= high:
                break
            r = self.value(sub, depth + 1)
            if r is None:
                if i < low:
                    return None
                break
            fixed.append(r)
        item = self.value(rest, depth + 1) if len(fixed) == len(prefix or []) else None
        if item is None:
            if len(fixed) < low:
                return None
            return r"\[" + _optional_chain(fixed, low) + r"\]"
        if not fixed:
            return r"\[" + repeat(item, low, None if high is None else int(high)) + r"\]"
        more_low = max(low - len(fixed), 0)
        more_high = None if high is None else int(high) - len(fixed)
        tail = f"(?:{ITEM_SEP}{item}){{{more_low},{'' if more_high is None else more_high}}}"
        head = ITEM_SEP.join(fixed)
        body = head + tail if low >= len(fixed) else f"(?:{_optional_chain(fixed, low)}|{head + tail})"
        return r"\[" + (body if low > 0 else f"(?:{body})?") + r"\]"

    def _object(self, s: dict, depth: int) -> str | None:
        props: dict[str, Any] = dict(s.get("properties") or {})
        required = list(dict.fromkeys(s.get("required") or []))
        extra = s.get("additionalProperties", True)
        for name in required:
            if name not in props:
                if extra is False:
                    raise SchemaError(
                        f"property {name!r} is required but additionalProperties is false and it has no schema"
                    )
                props[name] = extra if isinstance(extra, dict) else True
        if props and (s.get("minProperties", 0) > len(required) or "maxProperties" in s):
            self.unenforced.add("minProperties/maxProperties")
        if not props and extra is not False and "patternProperties" not in s:
            value = self.value(extra if isinstance(extra, dict) else True, depth + 1)
            if value is None:
                return r"\{\}"
            high = s.get("maxProperties")
            return r"\{" + repeat(FREE_KEY + KEY_SEP + value, int(s.get("minProperties", 0)), high) + r"\}"
        members = []
        for name, sub in props.items():
            value = self.value(sub, depth + 1)
            if value is None:
                if name in required:
                    return None
                continue
            members.append((json_literal(name) + KEY_SEP + value, name in required))
        return r"\{" + self._members(members) + r"\}"

    def _members(self, members: list[tuple[str, bool]]) -> str:
        """Object members in order: required ones always, optional ones maybe. While the regex
        exceeds the object budget, drop the biggest optional members (1, 2, 4, ... at a time)."""
        step = 1
        if self.object_budget == 0:  # the last resort: required members only
            self.dropped += sum(1 for m in members if not m[1])
            members = [m for m in members if m[1]]
        while True:
            regex = _member_regex(members)
            self.work += len(regex)
            optional = sorted((m for m in members if not m[1]), key=lambda m: -len(m[0]))
            if len(regex) <= self.object_budget or not optional:
                return regex
            if self.work > MAX_WORK_CHARS:
                raise _TooMuchWork("the schema's objects are too large to express; simplify it")
            gone = {id(m) for m in optional[:step]}
            members = [m for m in members if id(m) not in gone]
            self.dropped += len(gone)
            step *= 2

    # ------------------------------------------------------------ $ref, allOf

    def _ref(self, s: dict, depth: int) -> str | None:
        ref = s["$ref"]
        key = (ref, min(depth, ANY_DEPTH))
        rest = {k: v for k, v in s.items() if k != "$ref" and k not in _ANNOTATIONS}
        if not rest and key in self.memo:
            return self.memo[key]
        if self.ref_stack.count(ref) >= MAX_REF_DEPTH or len(self.ref_stack) >= MAX_REF_NESTING:
            self.cuts += 1
            return None
        target = self._resolve(ref)
        cuts = self.cuts
        self.ref_stack.append(ref)
        try:
            regex = self.value(self._merge(target, rest) if rest else target, depth)
        finally:
            self.ref_stack.pop()
        if not rest and self.cuts == cuts:
            self.memo[key] = regex
        return regex

    def _resolve(self, ref: str) -> Any:
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise SchemaError(f"$ref {ref!r} is not local; only refs into this schema (#/...) are supported")
        node = self.root
        for raw in [p for p in ref[1:].split("/") if p]:
            part = unquote(raw).replace("~1", "/").replace("~0", "~")
            if isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            elif isinstance(node, dict) and part in node:
                node = node[part]
            else:
                raise SchemaError(f"$ref {ref!r} points at nothing in the schema")
        return node

    def _resolve_all(self, s: Any) -> Any:
        """Follow a top-level $ref (with recursion cut-off) so parts can be merged."""
        seen = 0
        while isinstance(s, dict) and "$ref" in s and seen < MAX_REF_DEPTH:
            rest = {k: v for k, v in s.items() if k != "$ref"}
            target = self._resolve(s["$ref"])
            s = self._merge(target, rest) if rest else target
            seen += 1
        return s

    def _merge(self, a: Any, b: Any) -> Any:
        """Both schemas at once (allOf), for the keywords where that is a plain merge."""
        if a is True or a == {}:
            return b
        if b is True or b == {}:
            return a
        if a is False or b is False:
            return False
        out = dict(a)
        for key, value in b.items():
            if key not in out or out[key] == value:
                out[key] = value
            elif key == "properties":
                merged = dict(out[key])
                for name, sub in value.items():
                    merged[name] = self._merge(merged[name], sub) if name in merged else sub
                out[key] = merged
            elif key == "required":
                out[key] = list(dict.fromkeys([*out[key], *value]))
            elif key == "type":
                left = {out[key]} if isinstance(out[key], str) else set(out[key])
                right = {value} if isinstance(value, str) else set(value)
                both = [t for t in _TYPES if t in left & right] or (["number"] if "integer" in left | right else [])
                if not both:
                    raise SchemaError(f"allOf needs type {sorted(left)} and {sorted(right)} at once; no value is both")
                out[key] = both if len(both) > 1 else both[0]
            elif key in ("anyOf", "oneOf", "allOf"):
                out["allOf"] = [*out.get("allOf", []), {key: value}]
            else:
                if key not in _ANNOTATIONS and not key.startswith(("x-", "$")) and key not in _CONTAINERS:
                    self.unenforced.add(f"allOf {key}")
                out[key] = value
        return out


_CONTAINERS = {"definitions", "$defs", "id"}
_CONDITIONAL = ("if", "dependentRequired", "dependentSchemas", "dependencies", "propertyNames")
_ANNOTATIONS = {"description", "title", "default", "examples", "$comment", "deprecated", "readOnly", "writeOnly"}


def _optional_chain(items: list[str], low: int) -> str:
    """The first k of `items` for any k >= low, comma-separated."""
    regex = ""
    for i in range(len(items) - 1, -1, -1):
        piece = (ITEM_SEP if i else "") + items[i] + regex
        regex = piece if i < low else f"(?:{piece})?"
    return regex


def _member_regex(members: list[tuple[str, bool]]) -> str:
    # Built from the last member back. `after`: the rest when a member is already written
    # (each then starts with ", "); `first`: the rest when none is written yet.
    after, first = "", ""
    for text, required in reversed(members):
        tail = text + after
        after = ITEM_SEP + tail if required else f"(?:{ITEM_SEP}{text})?{after}"
        first = tail if required else (f"(?:{tail}|{first})" if first else f"(?:{tail})?")
    return first


def regex_for_choices(choices: list[str]) -> str:
    """One of the given strings, exactly."""
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
        raise SchemaError("choices must be a non-empty list of non-empty strings")
    return alternation([escape(c) for c in choices])
