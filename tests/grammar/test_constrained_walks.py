"""Every random walk under a constraint yields a valid, complete output, for both tokenizer
families: JSON that validates, regex full matches, one of the choices."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from tests.grammar.schemas import CHOICES, REGEXES, SCHEMAS

SEEDS = range(10)
# Formats the checker can judge without extra packages (its "time" is draft 3's HH:MM:SS).
FORMATS = jsonschema.FormatChecker(formats=["date", "email", "ipv4", "uuid"])


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_every_walk_validates_against_its_schema(family, name: str) -> None:
    schema = SCHEMAS[name]
    checker = jsonschema.Draft202012Validator(schema, format_checker=FORMATS)
    for seed in SEEDS:
        text, ended, _ = family.walk({"json_schema": schema}, seed)
        assert ended, f"{name} seed {seed}: not finished: {text[:200]!r}"
        errors = [e.message for e in checker.iter_errors(json.loads(text))]
        assert not errors, f"{name} seed {seed}: {text!r}: {errors}"


@pytest.mark.parametrize("regex", REGEXES)
def test_every_walk_fullmatches_its_regex(family, regex: str) -> None:
    for seed in SEEDS:
        text, ended, _ = family.walk({"regex": regex}, seed)
        assert ended and re.fullmatch(regex, text), (seed, text)


@pytest.mark.parametrize("choices", CHOICES)
def test_every_walk_is_one_of_the_choices(family, choices: list[str]) -> None:
    seen = set()
    for seed in SEEDS:
        text, ended, _ = family.walk({"choices": choices}, seed)
        assert ended and text in choices, (seed, text)
        seen.add(text)
    assert len(seen) > 1, "random walks should not all pick the same choice"


def test_json_object_walks_are_objects(family) -> None:
    # Strings in json_object are unbounded, and random logits rarely close a quote in some
    # vocabularies (Llama 2's), so a walk may hit the token budget; every walk that ends is
    # an object.
    ended_walks = 0
    for seed in SEEDS:
        text, ended, _ = family.walk({"json_object": True}, seed, max_tokens=3000)
        if ended:
            ended_walks += 1
            assert isinstance(json.loads(text), dict), (seed, text[:200])
    assert ended_walks >= 1


def test_jump_forward_writes_the_fixed_parts(family) -> None:
    _, _, forced = family.walk({"json_schema": SCHEMAS["nested"]}, 0)
    assert forced >= 8  # {"user": {"id": , "address": {"street": "  ...  ", "zip": "
