"""oneOf exclusivity: generate each branch so that no output matches two of them.

The regex of a oneOf is the alternation of its branches' regexes, so an output generated for
branch i must not also validate against a branch j. `exclusive` decides, for each pair,
whether every instance Arbor's regex writes for i fails j; where it may not, it narrows
what i generates (every narrowed output still validates against i):

- enum/const values j also lists are left out of i's;
- arrays whose items can never be j's items get at least one;
- a key j requires and i does not is never written for i;
- where j forbids extra keys, one of i's own keys that j lacks becomes required.

A branch that cannot be made exclusive is not generated; if none can, the schema is refused
up front with the two branches named. The tests are sufficient, not complete (a
conservative "maybe" narrows or drops a branch):

- the JSON types of i's instances and the types j admits are disjoint (integer is a number);
- i's const/enum values and j's differ (compared as JSON, so 1 and true are different);
- objects: j requires a key i never writes (i writes only its own properties), j forbids
  extra keys and i always writes one it lacks, or a key i always writes can never validate
  against j's schema for it (recursively: a discriminator);
- arrays: i always writes a first item that j's `items` refuses.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from arbor.grammar.regex_parts import SchemaError, infer_type

_KINDS = ("null", "boolean", "number", "string", "array", "object")
_UNKNOWN = frozenset(_KINDS)
MAX_DEPTH = 8  # nested anyOf/oneOf/allOf levels read when working out a schema's kinds
Resolve = Callable[[Any], Any]


def exclusive(branches: list[Any], resolve: Resolve) -> list[Any]:
    """The schemas to generate for a oneOf's branches: each one (maybe narrowed) whose
    outputs match no other branch. Raises SchemaError naming two overlapping branches when
    no branch can be generated."""
    resolved = [resolve(b) for b in branches]
    keep: list[Any] = []
    clash: tuple[int, int] | None = None
    for i, gen in enumerate(resolved):
        for j, other in enumerate(resolved):
            if j == i or _never_matches(gen, other, resolve):
                continue
            gen = _narrow(gen, other, resolve)
            if gen is None:
                clash = clash or (i, j)
                break
        else:
            keep.append(gen)
    if not keep and clash is not None:
        shown = " and ".join(f"{k} ({_short(branches[k])})" for k in clash)
        raise SchemaError(
            f"oneOf branches {shown} may both match one output, and Arbor cannot generate either one "
            "while excluding the other; make the branches exclusive (different types, or a const/enum "
            "on a required property) or use anyOf"
        )
    return keep


def _narrow(gen: Any, other: Any, resolve: Resolve) -> dict | None:
    """`gen` narrowed so that none of its generated instances validates against `other`."""
    if not isinstance(gen, dict) or not isinstance(other, dict) or _composite(other):
        return None
    values, allowed = _listed(gen), _values(other)
    if values is not None and allowed is not None:
        left = [v for v in values if _canon(v) not in allowed]
        narrowed = {k: v for k, v in gen.items() if k != "const"} | {"enum": left}
        return narrowed if left else None
    if _written_kinds(gen, resolve) == {"array"} and gen.get("maxItems", 1) >= 1:
        narrowed = {**gen, "minItems": max(1, gen.get("minItems", 0))}  # the empty array matches both
        return narrowed if _never_matches(narrowed, other, resolve) else None
    if _written_kinds(gen, resolve) != {"object"} or _composite(gen) or "patternProperties" in gen:
        return None
    props = dict(gen.get("properties") or {})
    required = list(gen.get("required") or [])
    if not props:
        return None  # free keys: no key is surely absent
    missing = [k for k in other.get("required") or [] if k not in required]
    if missing:
        props.pop(missing[0], None)
        narrowed = {**gen, "properties": props}
    elif other.get("additionalProperties", True) is False and "patternProperties" not in other:
        foreign = [k for k in props if k not in (other.get("properties") or {})]
        if not foreign:
            return None
        narrowed = {**gen, "required": [*required, foreign[0]]}
    else:
        return None
    return narrowed if _never_matches(narrowed, other, resolve) else None


def _never_matches(gen: Any, other: Any, resolve: Resolve) -> bool:
    """Whether no instance Arbor generates for `gen` validates against `other`."""
    gen, other = resolve(gen), resolve(other)
    if other is False or gen is False:
        return True
    if not isinstance(gen, dict) or not isinstance(other, dict):
        return False
    if not _written_kinds(gen, resolve) & _admitted_kinds(other, resolve):
        return True
    values, allowed = _values(gen), _values(other)
    if values is not None and allowed is not None and not _composite(other) and not values & allowed:
        return True
    written = _written_kinds(gen, resolve)
    if written == {"object"} and "object" in _admitted_kinds(other, resolve):
        return _objects_differ(gen, other, resolve)
    if written == {"array"} and "array" in _admitted_kinds(other, resolve):
        return _arrays_differ(gen, other, resolve)
    return False


def _arrays_differ(gen: dict, other: dict, resolve: Resolve) -> bool:
    """Whether gen's arrays always hold a first item that other's `items` refuses."""
    items, theirs = gen.get("items"), other.get("items")
    if _composite(gen) or _composite(other) or "prefixItems" in gen or "prefixItems" in other:
        return False
    if not isinstance(items, dict) or not isinstance(theirs, dict) or gen.get("minItems", 0) < 1:
        return False
    return _never_matches(items, theirs, resolve)


def _objects_differ(gen: dict, other: dict, resolve: Resolve) -> bool:
    if _composite(gen) or _composite(other) or "patternProperties" in gen:
        return False
    props = gen.get("properties") or {}
    required = set(gen.get("required") or [])
    writes_free_keys = not props and gen.get("additionalProperties", True) is not False
    written = set(props) | required
    if not writes_free_keys and set(other.get("required") or []) - written:
        return True  # a key `other` needs is never written
    other_props = other.get("properties") or {}
    if (
        other.get("additionalProperties", True) is False
        and "patternProperties" not in other
        and required - set(other_props)
    ):
        return True  # a key always written is one `other` forbids
    return any(
        key in other_props and key in props and _never_matches(props[key], other_props[key], resolve)
        for key in required
    )


def _short(schema: Any) -> str:
    text = json.dumps(schema)
    return text if len(text) <= 60 else text[:57] + "..."


def _composite(s: dict) -> bool:
    return any(k in s for k in ("anyOf", "oneOf", "allOf", "not", "$ref", "if"))


def _values(s: dict) -> set[str] | None:
    """The const/enum values, as canonical JSON, or None when the schema has neither."""
    if "const" in s:
        return {_canon(s["const"])}
    if isinstance(s.get("enum"), list):
        return {_canon(v) for v in s["enum"]}
    return None


def _canon(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 1.0 and 1 are the same JSON number
    return json.dumps(value, sort_keys=True)


def _written_kinds(s: Any, resolve: Resolve, depth: int = 0) -> frozenset[str]:
    """JSON kinds of the instances the regex writes for `s` (all, when in doubt); without a
    `type`, the one the regex builder infers from the keywords."""
    return _kinds(s, resolve, depth, written=True)


def _admitted_kinds(s: Any, resolve: Resolve, depth: int = 0) -> frozenset[str]:
    """JSON kinds `s` lets validate (all, when in doubt; without a `type`, every kind)."""
    return _kinds(s, resolve, depth, written=False)


def _kinds(s: Any, resolve: Resolve, depth: int, written: bool) -> frozenset[str]:
    """Kinds of a schema: its const/enum values', its type's (integer is a number), the union
    of its anyOf/oneOf branches' and the intersection with its allOf parts'."""
    s = resolve(s)
    if s is False:
        return frozenset()
    if not isinstance(s, dict) or depth > MAX_DEPTH or any(k in s for k in ("not", "if", "$ref")):
        return _UNKNOWN
    values = _listed(s)
    if values is not None:
        kinds = frozenset(_kind(v) for v in values)
    else:
        composite = any(k in s for k in ("anyOf", "oneOf", "allOf"))
        types = s.get("type", infer_type(s) if written and not composite else None)
        kinds = _declared(types)
    for key in ("anyOf", "oneOf"):
        if isinstance(s.get(key), list):
            kinds &= frozenset().union(*(_kinds(b, resolve, depth + 1, written) for b in s[key]))
    for part in s.get("allOf") or []:
        kinds &= _kinds(part, resolve, depth + 1, written)
    return kinds


def _listed(s: dict) -> list[Any] | None:
    values = [s["const"]] if "const" in s else s.get("enum")
    return values if isinstance(values, list) else None


def _declared(types: Any) -> frozenset[str]:
    if types is None:
        return _UNKNOWN
    types = [types] if isinstance(types, str) else types
    kinds = {"number" if t == "integer" else t for t in types if isinstance(t, str)}
    return frozenset(kinds & set(_KINDS)) or _UNKNOWN


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"
