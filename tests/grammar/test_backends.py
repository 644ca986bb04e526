"""The three grammar backends behind one matcher interface: outlines, xgrammar, llguidance.

Masks agree where the languages agree (xgrammar bit for bit with outlines; llguidance too,
except that it leaves out a token that only starts the text the grammar forces, so the
canonical token is taken); every backend's walks validate; EBNF and structural tags work on
the pushdown backends; routing, errors and the compile service hold for each.
"""

from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import pytest
import torch

from arbor.grammar.compiler import GrammarError
from arbor.grammar.constraint import backend_for, constraint_from_params, post_checked
from tests.grammar.random_walk import Family

PUSHDOWN = ("xgrammar", "llguidance")
# Constraints whose languages are the same on every backend: no unbounded numbers, no free
# strings, objects closed (llguidance follows the spec: additionalProperties defaults to true).
SAME_LANGUAGE = [
    {"regex": r"[0-9]+(\.[0-9]+)?"},
    {"regex": r"(yes|no)(, (yes|no))*"},
    {"regex": r"[a-z]{2,8}@[a-z]{3}\.(com|org)"},
    {"choices": ["red", "green", "blue green"]},
    {
        "json_schema": {
            "type": "object",
            "properties": {"ok": {"type": "boolean"}, "color": {"enum": ["red", "green"]}},
            "required": ["ok", "color"],
            "additionalProperties": False,
        }
    },
    {"json_schema": {"type": "array", "items": {"type": "boolean"}}},
    {
        "json_schema": {
            "type": "object",
            "properties": {"tags": {"type": "array", "items": {"enum": ["a", "b"]}}, "x": {"type": "null"}},
            "required": ["tags", "x"],
            "additionalProperties": False,
        }
    },
]
EBNF = 'root ::= answer (", " answer)*\nanswer ::= "yes" | "no" | "maybe " [0-9] [0-9]?'
EBNF_TEXT = re.compile(r"(yes|no|maybe [0-9][0-9]?)(, (yes|no|maybe [0-9][0-9]?))*")
TOOL_TAG = {
    "type": "structural_tag",
    "triggers": ["<fn="],
    "structures": [
        {
            "begin": "<fn=get>",
            "schema": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
            "end": "</fn>",
        }
    ],
}


@pytest.fixture(scope="module")
def families(tiny_model) -> dict[str, Family]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model("llama"))
    out = {b: Family(tokenizer, b) for b in ("outlines", *PUSHDOWN)}
    yield out
    for family in out.values():
        family.close()


def _compile(family: Family, params: dict):
    return family.compiler.compile(constraint_from_params(dict(params), family.compiler.config.backend))


def _bits(row: np.ndarray, width: int) -> np.ndarray:
    return np.unpackbits(row.view(np.uint8), bitorder="little")[:width].astype(bool)


@pytest.mark.parametrize("params", [*SAME_LANGUAGE, {"ebnf": EBNF}], ids=lambda p: json.dumps(p)[:40])
def test_masks_agree_where_the_languages_agree(families, params: dict) -> None:
    # EBNF has no outlines form: there xgrammar is the reference.
    reference = "xgrammar" if "ebnf" in params else "outlines"
    vocab = families[reference].vocab
    width = vocab.logits_size
    grammars = {b: _compile(f, params) for b, f in families.items() if b != "outlines" or reference == "outlines"}
    for seed in range(3):
        matchers = {b: g.matcher() for b, g in grammars.items()}
        gen = torch.Generator().manual_seed(seed)
        for step in range(30):
            masks = {}
            for b, m in matchers.items():
                row = np.zeros(grammars[b].tables.words, dtype=np.int32)
                m.fill_bitmask(row)
                masks[b] = _bits(row, width)
            where = f"seed {seed} step {step}"
            assert np.array_equal(masks["xgrammar"], masks[reference]), where
            lacking = np.flatnonzero(masks[reference] & ~masks["llguidance"])
            assert not (masks["llguidance"] & ~masks[reference]).any(), where
            forced = matchers["llguidance"].forced_bytes()
            for tok in lacking.tolist():  # only tokens that start the forced text, not all of it
                assert forced.startswith(vocab.token_bytes[tok]) and len(forced) > len(vocab.token_bytes[tok]), where
            allowed = [t for t in np.flatnonzero(masks["llguidance"]).tolist() if t not in vocab.eos_ids]
            if not allowed:
                break
            tok = allowed[int(torch.randint(len(allowed), (1,), generator=gen))]
            for b, m in matchers.items():
                assert m.accept_token(tok), (b, where)


# Bounded, closed schemas: random logits end an unbounded number or free string (or
# llguidance's open objects: additionalProperties defaults to true there) almost never.
BOUNDED = [
    {
        "type": "object",
        "properties": {
            "street": {"type": "string", "maxLength": 20},
            "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
        },
        "required": ["street", "zip"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer", "minimum": 1, "maximum": 999},
                    "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 4},
                },
                "required": ["id", "tags"],
                "additionalProperties": False,
            },
            "ok": {"type": "boolean"},
        },
        "required": ["user", "ok"],
        "additionalProperties": False,
    },
    {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{1,4}$"}, "minItems": 1, "maxItems": 3},
    {
        "anyOf": [
            {"type": "null"},
            {
                "type": "object",
                "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["zip"],
                "additionalProperties": False,
            },
        ]
    },
]


@pytest.mark.parametrize("backend", PUSHDOWN)
@pytest.mark.parametrize("schema", BOUNDED, ids=lambda s: json.dumps(s)[:30])
def test_pushdown_walks_validate(families, backend: str, schema: dict) -> None:
    for seed in range(6):
        text, done, _ = families[backend].walk({"json_schema": schema}, seed, max_tokens=400)
        assert done, (seed, text[:200])
        jsonschema.validate(json.loads(text), schema)


@pytest.mark.parametrize("backend", PUSHDOWN)
def test_ebnf_walks_match_the_grammar(families, backend: str) -> None:
    for seed in range(8):
        text, done, _ = families[backend].walk({"ebnf": EBNF}, seed, max_tokens=200)
        assert done and EBNF_TEXT.fullmatch(text), (seed, text)


@pytest.mark.parametrize("backend", PUSHDOWN)
def test_ebnf_refuses_what_the_grammar_refuses(families, backend: str) -> None:
    family = families[backend]
    matcher = _compile(family, {"ebnf": EBNF}).matcher()
    assert matcher.accept_tokens(family.retok.encode(b"yes, maybe 4"))
    assert matcher.allows_end() and not matcher.is_terminated()  # a digit or ", " may still follow
    assert not matcher.accept_tokens(family.retok.encode(b"x"))
    assert matcher.accept_tokens(family.retok.encode(b"2"))
    assert matcher.allows_end()


@pytest.mark.parametrize("backend", PUSHDOWN)
def test_structural_tag_constrains_only_inside_the_tag(families, backend: str) -> None:
    family = families[backend]
    grammar = _compile(family, {"structural_tag": TOOL_TAG})
    matcher = grammar.matcher()
    assert matcher.accept_tokens(family.retok.encode(b"Let me look that up. "))  # free text
    assert matcher.allows_end()
    assert matcher.accept_tokens(family.retok.encode(b"<fn="))
    assert not matcher.allows_end()  # inside a tag the output may not end
    assert matcher.forced_bytes().startswith(b"get>")
    assert not matcher.accept_tokens(family.retok.encode(b'get>{"y": 1}'))  # x is required
    assert matcher.accept_tokens(family.retok.encode(b'get>{"x": 12}</fn>'))
    assert matcher.allows_end() and matcher.accept_tokens(family.retok.encode(b" Done."))


def test_structural_tag_current_format_on_xgrammar(families) -> None:
    tag = {
        "type": "structural_tag",
        "format": {
            "type": "triggered_tags",
            "triggers": ["<t>"],
            "tags": [
                {
                    "type": "tag",
                    "begin": "<t>",
                    "content": {"type": "json_schema", "json_schema": {"enum": [1, 2]}},
                    "end": "</t>",
                }
            ],
        },
    }
    family = families["xgrammar"]
    matcher = _compile(family, {"structural_tag": tag}).matcher()
    assert matcher.accept_tokens(family.retok.encode(b"so <t>"))
    assert not matcher.accept_tokens(family.retok.encode(b"3"))
    assert matcher.accept_tokens(family.retok.encode(b"2</t>"))
    assert _compile(families["llguidance"], {"structural_tag": tag}) is not None  # JSON-schema tags: both
    tag["format"]["at_least_one"] = True
    with pytest.raises(GrammarError, match="llguidance backend takes structural tags of JSON-schema tags"):
        _compile(families["llguidance"], {"structural_tag": tag})
    assert _compile(family, {"structural_tag": tag}) is not None


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ({"type": "structural_tag", "triggers": ["<a"]}, "structures must be a list"),
        (
            {"type": "structural_tag", "triggers": ["<a"], "structures": [{"begin": "<b>", "end": "</b>"}]},
            "starts with none of the triggers",
        ),
        ("{not json", "not valid JSON"),
    ],
)
def test_bad_structural_tags_name_the_problem(value, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        constraint_from_params({"structural_tag": value}, "xgrammar")


@pytest.mark.parametrize("backend", PUSHDOWN)
def test_bad_grammars_fail_with_the_backends_words(families, backend: str) -> None:
    with pytest.raises(GrammarError, match="does not compile"):
        _compile(families[backend], {"ebnf": 'root ::= "a" undefined_rule'})
    assert _compile(families[backend], {"regex": "[ab]+"}) is not None  # the service still works


def test_outlines_hands_cfg_kinds_to_xgrammar(families) -> None:
    assert backend_for("outlines", "ebnf") == backend_for("outlines", "structural_tag") == "xgrammar"
    assert backend_for("outlines", "json_schema") == "outlines" and backend_for("llguidance", "ebnf") == "llguidance"
    grammar = _compile(families["outlines"], {"ebnf": EBNF})
    assert type(grammar).__name__ == "XgrammarGrammar"
    with pytest.raises(ValueError, match="pushdown-automaton backend"):
        from arbor.grammar.constraint import Constraint, plan

        plan(Constraint("ebnf", EBNF))


def test_pushdown_json_is_validated_after_generation() -> None:
    constraint = constraint_from_params({"json_schema": {"type": "integer", "minimum": 3}})
    assert post_checked(constraint, "outlines") == []
    assert post_checked(constraint, "xgrammar") and post_checked(constraint, "llguidance")
