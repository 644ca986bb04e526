"""Structural tags: free text in which tagged segments follow a schema (tool calls inside prose).

Two spellings reach the server, as SGLang and xgrammar define them:
- legacy: `{"type": "structural_tag", "structures": [{"begin", "schema", "end"}], "triggers": [...]}`:
  text is free until a trigger appears; from there one of the structures whose `begin` starts
  with that trigger is written, its body a JSON value of `schema`, then `end`; free text again;
- current: `{"type": "structural_tag", "format": {...}}`, xgrammar's format tree.

`canonical` turns either into the current form (the compile cache's key); the legacy one
becomes a `triggered_tags` format. xgrammar compiles every format; llguidance takes
`triggered_tags` of JSON-schema tags (`to_lark`).
"""

from __future__ import annotations

import json
from typing import Any

from arbor.grammar.nesting import check_json

MAX_TAGS = 64


def canonical(value: Any) -> dict[str, Any]:
    """The current-form dict of a structural tag given as a dict or its JSON text; raises
    ValueError naming what is wrong."""
    if isinstance(value, str):
        value = _json_text(value, "structural_tag")
    if not isinstance(value, dict):
        raise ValueError(
            "structural_tag must be an object: {type: structural_tag, structures, triggers} "
            "or {type: structural_tag, format}"
        )
    if "format" in value:
        if not isinstance(value["format"], dict) or not isinstance(value["format"].get("type"), str):
            raise ValueError("structural_tag.format must be an object with a type (xgrammar's format)")
        return {"type": "structural_tag", "format": value["format"]}
    return {"type": "structural_tag", "format": _legacy_format(value)}


def _legacy_format(value: dict[str, Any]) -> dict[str, Any]:
    structures, triggers = value.get("structures"), value.get("triggers")
    if not isinstance(structures, list) or not structures or len(structures) > MAX_TAGS:
        raise ValueError(f"structural_tag.structures must be a list of 1 to {MAX_TAGS} {{begin, schema, end}}")
    if not isinstance(triggers, list) or not triggers or not all(isinstance(t, str) and t for t in triggers):
        raise ValueError("structural_tag.triggers must be a non-empty list of non-empty strings")
    tags = []
    for i, s in enumerate(structures):
        if not isinstance(s, dict) or not isinstance(s.get("begin"), str) or not isinstance(s.get("end"), str):
            raise ValueError(f"structural_tag.structures[{i}] needs string begin and end")
        if not any(s["begin"].startswith(t) for t in triggers):
            raise ValueError(
                f"structural_tag.structures[{i}].begin {s['begin'][:40]!r} starts with none of the triggers"
            )
        schema = s.get("schema", {})
        if isinstance(schema, str):
            schema = _json_text(schema, f"structural_tag.structures[{i}].schema")
        if not isinstance(schema, (dict, bool)):
            raise ValueError(f"structural_tag.structures[{i}].schema must be a JSON Schema object")
        tags.append(
            {
                "type": "tag",
                "begin": s["begin"],
                "content": {"type": "json_schema", "json_schema": schema},
                "end": s["end"],
            }
        )
    return {
        "type": "triggered_tags",
        "triggers": triggers,
        "tags": tags,
        "at_least_one": bool(value.get("at_least_one", False)),
        "stop_after_first": False,
    }


def to_lark(tag: dict[str, Any]) -> str:
    """The llguidance grammar of a canonical structural tag, built by llguidance's own
    `StructTag`: free text with lazily triggered tags, each `begin <JSON of schema> end`.
    Only `triggered_tags` of JSON-schema tags has this form; anything else raises ValueError
    naming the backend that takes it."""
    import llguidance

    fmt = tag["format"]
    tags = fmt.get("tags") if fmt.get("type") == "triggered_tags" else None
    if (
        not tags
        or fmt.get("at_least_one")
        or fmt.get("stop_after_first")
        or any(t.get("type") != "tag" or (t.get("content") or {}).get("type") != "json_schema" for t in tags)
    ):
        raise ValueError(
            "the llguidance backend takes structural tags of JSON-schema tags (the legacy "
            "structures/triggers form, without at_least_one); use --grammar-backend xgrammar "
            "for other formats"
        )
    items = [
        llguidance.StructTag(
            trigger=next(tr for tr in fmt["triggers"] if t["begin"].startswith(tr)),
            begin=t["begin"],
            grammar=t["content"]["json_schema"],
            end=t["end"],
        )
        for t in tags
    ]
    # Triggers are matched as text: a tokenizer's special tokens have no bytes here (vocabulary.py).
    return llguidance.StructTag.to_grammar(items, assume_special=False)


def _json_text(text: str, field: str) -> Any:
    check_json(text, field)  # json.loads recurses once per level
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{field} is not valid JSON: {exc}") from None
