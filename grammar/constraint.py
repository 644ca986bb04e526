"""Constraint: what a request's output must match, as it travels to the scheduler."""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec

from arbor.grammar.json_schema import RegexPlan, any_json_regex, regex_for_choices, schema_to_regex
from arbor.grammar.linear_regex import check_schema_patterns, compile_ecma, scanner
from arbor.grammar.nesting import check_json, check_regex
from arbor.grammar.plan_cache import PlanCache
from arbor.grammar.regex_parts import SchemaError
from arbor.grammar.structural_tag import canonical

KINDS = ("json_schema", "regex", "choices", "json_object", "ebnf", "structural_tag")
BACKENDS = ("outlines", "xgrammar", "llguidance")
REGULAR_KINDS = ("json_schema", "regex", "choices", "json_object")  # what the outlines backend takes
MAX_CONSTRAINT_CHARS = 200_000


class Constraint(msgspec.Struct, frozen=True, tag=True):
    """kind: one of KINDS; text: its canonical source. Frozen, so it keys the compile cache."""

    kind: str
    text: str = ""


def backend_for(configured: str, kind: str) -> str:
    """The backend that compiles `kind` on a server configured with `configured`: EBNF and
    structural tags need a pushdown automaton, so outlines hands them to xgrammar."""
    return "xgrammar" if configured == "outlines" and kind not in REGULAR_KINDS else configured


def post_checked(constraint: Constraint, backend: str) -> list[str]:
    """The schema keywords a finished output is validated against after generation: those
    Arbor's regex cannot express on outlines; on the other backends, the whole schema."""
    if constraint.kind != "json_schema":
        return []
    if backend == "outlines":
        return plan(constraint).unenforced
    return [f"(every keyword: the {backend} backend's output is validated after generation)"]


def constraint_from_params(params: dict[str, Any], backend: str = "outlines") -> Constraint | None:
    """Pop `regex`, `json_schema`, `choices`, `json_object`, `ebnf` or `structural_tag` from a
    sampling-params dict; raises ValueError (an HTTP 400) when it is malformed or there is
    more than one. Checks what can be checked without compiling on `backend`."""
    given = {k: params.pop(k) for k in KINDS if params.get(k) is not None}
    for k in KINDS:
        params.pop(k, None)
    if not given:
        return None
    if len(given) > 1:
        raise ValueError(f"give at most one of {', '.join(KINDS)}; got {', '.join(given)}")
    kind, value = next(iter(given.items()))
    if kind == "json_object":
        if value is not True:
            raise ValueError("json_object must be true")
        constraint = Constraint("json_object")
    elif kind == "json_schema":
        if isinstance(value, str):
            check_json(value, "json_schema")  # json.loads recurses per level
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"json_schema is not valid JSON: {exc}") from None
        if not isinstance(value, (dict, bool)):
            raise ValueError("json_schema must be a JSON Schema object (or its JSON text)")
        check_schema_patterns(value)  # the output may be validated against them, on RE2
        constraint = Constraint("json_schema", json.dumps(value, separators=(",", ":"), ensure_ascii=False))
    elif kind == "choices":
        constraint = Constraint("choices", json.dumps(value, ensure_ascii=False))
    elif kind == "ebnf":
        if not isinstance(value, str) or not value.strip():
            raise ValueError("ebnf must be a non-empty grammar text (GBNF: root ::= ...)")
        constraint = Constraint("ebnf", value)
    elif kind == "structural_tag":
        constraint = Constraint(
            "structural_tag", json.dumps(canonical(value), separators=(",", ":"), ensure_ascii=False)
        )
    else:
        if not isinstance(value, str) or not value:
            raise ValueError("regex must be a non-empty string")
        constraint = Constraint("regex", value)
    if len(constraint.text) > MAX_CONSTRAINT_CHARS:
        raise ValueError(f"{kind} has {len(constraint.text):,} characters; the limit is {MAX_CONSTRAINT_CHARS:,}")
    if backend_for(backend, kind) == "outlines" or kind in ("regex", "choices"):
        plan(constraint)  # fail fast on what can be checked without compiling
    return constraint


_NEGATED_CLASS = scanner(r"\[\^(?:\\.|[^\]\\])*\]")  # RE2: a regex of many \[^ is quadratic on re


PLANS = PlanCache()  # this process's plans, bounded in bytes; see grammar/plan_cache.py


def plan(constraint: Constraint) -> RegexPlan:
    """The regex a regular constraint compiles to; raises ValueError naming the problem. A plan
    computed here waits on probation until `keep_plan` says its request ran."""
    return PLANS.get(constraint) or PLANS.trial(constraint, _plan(constraint))


def keep_plan(constraint: Constraint | None) -> None:
    """The request constrained by `constraint` ran (it was not refused): keep its plan."""
    if constraint is not None:
        PLANS.keep(constraint)


def _plan(constraint: Constraint) -> RegexPlan:
    try:
        if constraint.kind == "json_schema":
            return schema_to_regex(json.loads(constraint.text))
        if constraint.kind == "json_object":
            return RegexPlan(any_json_regex(top_object=True))
        if constraint.kind == "choices":
            return RegexPlan(regex_for_choices(json.loads(constraint.text)))
        if constraint.kind == "regex":
            check_regex(constraint.text, "regex")  # re's parser recurses per group
            try:
                re.compile(constraint.text)
            except re.error as exc:
                raise SchemaError(f"regex {constraint.text[:80]!r} is invalid: {exc}") from None
            named = _NEGATED_CLASS.sub("", constraint.text)  # [^...\x00...] excludes NUL
            if "\\x00" in named or "\x00" in named:
                raise SchemaError("regex may not match the NUL character")
            return RegexPlan(constraint.text)
    except SchemaError as exc:
        raise ValueError(f"{constraint.kind}: {exc}") from None
    if constraint.kind in KINDS:
        raise ValueError(f"{constraint.kind} needs a pushdown-automaton backend (xgrammar or llguidance)")
    raise ValueError(f"unknown constraint kind {constraint.kind!r}; use one of {', '.join(KINDS)}")


def check_output(constraint: Constraint | None, text: str, unenforced: list[str]) -> dict[str, Any]:
    """Validate a finished output against the keywords its regex could not enforce. Schema
    patterns run on RE2, in time linear in the text: a backtracking pattern cannot stall
    the caller (the server's event loop)."""
    import jsonschema

    result: dict[str, Any] = {"unenforced": unenforced, "valid": True, "error": None}
    if constraint is None or constraint.kind != "json_schema":
        return result
    schema = json.loads(constraint.text)
    try:
        check_json(text, "the output")  # json.loads and the validator recurse per level
        _linear_validator(schema).validate(json.loads(text))
    except (ValueError, OverflowError, jsonschema.ValidationError, jsonschema.SchemaError) as exc:
        result.update(valid=False, error=str(exc).split("\n")[0][:300])
    return result


def _linear_validator(schema: Any) -> Any:
    """A jsonschema validator for `schema` whose regex keywords (`pattern`, `patternProperties`
    and the `additionalProperties` beside it) run on RE2. `unevaluatedProperties` with
    `patternProperties` never gets here: check_schema_patterns refuses it."""
    import jsonschema

    def pattern(validator: Any, regex: str, instance: Any, _schema: Any) -> Any:
        if validator.is_type(instance, "string") and not _re2(regex).search(instance):
            yield jsonschema.ValidationError(f"{instance[:80]!r} does not match {regex!r}")

    def pattern_properties(validator: Any, patterns: dict[str, Any], instance: Any, _schema: Any) -> Any:
        if not validator.is_type(instance, "object"):
            return
        for regex, subschema in patterns.items():
            for key, value in instance.items():
                if _re2(regex).search(key):
                    yield from validator.descend(value, subschema, path=key, schema_path=regex)

    def additional_properties(validator: Any, extra: Any, instance: Any, schema: dict[str, Any]) -> Any:
        if not validator.is_type(instance, "object"):
            return
        named, patterns = schema.get("properties", {}), [_re2(r) for r in schema.get("patternProperties", {})]
        extras = [k for k in instance if k not in named and not any(r.search(k) for r in patterns)]
        if validator.is_type(extra, "object"):
            for key in extras:
                yield from validator.descend(instance[key], extra, path=key)
        elif extra is False and extras:
            yield jsonschema.ValidationError(f"additional properties are not allowed ({extras[0][:80]!r} is one)")

    base = jsonschema.validators.validator_for(schema)
    linear = jsonschema.validators.extend(
        base,
        {"pattern": pattern, "patternProperties": pattern_properties, "additionalProperties": additional_properties},
    )
    return linear(schema)


def _re2(regex: str) -> Any:
    return compile_ecma(regex, "json_schema pattern")
