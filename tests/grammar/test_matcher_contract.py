"""Every matcher keeps the `Matcher` contract (grammar/matcher.py): each backend's, and a
ReasoningGate around each, walked the same way through one constraint."""

from __future__ import annotations

import numpy as np
import pytest

from arbor.grammar.constraint import constraint_from_params
from arbor.grammar.matcher import CompiledConstraint, Matcher
from arbor.grammar.reasoning_gate import ReasoningGate
from tests.grammar.random_walk import Family

BACKENDS = ("outlines", "xgrammar", "llguidance")
CHOICES = {"choices": ["red fox", "green"]}


@pytest.fixture(scope="module")
def families(tiny_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model("llama"))
    out = {b: Family(tokenizer, b) for b in BACKENDS}
    yield out
    for family in out.values():
        family.close()


def _matcher(family: Family, gated: bool) -> Matcher:
    grammar = family.compiler.compile(constraint_from_params(dict(CHOICES), family.compiler.config.backend))
    assert isinstance(grammar, CompiledConstraint)
    matcher: Matcher = grammar.matcher()
    if gated:  # a gate past its reasoning section passes the answer through to the grammar
        matcher = ReasoningGate(matcher, [1], [2], opens_inside=True)
        assert matcher.accept_token(2)
    return matcher


def _allowed(matcher: Matcher, family: Family) -> set[int]:
    mask = np.zeros(matcher.grammar.tables.words, dtype=np.int32)
    matcher.fill_bitmask(mask)
    bits = np.unpackbits(mask.view(np.uint8), bitorder="little")
    return set(np.flatnonzero(bits[: family.vocab.logits_size]).tolist())


@pytest.mark.parametrize("gated", [False, True], ids=["plain", "reasoning-gate"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_matcher_contract(families, backend: str, gated: bool) -> None:
    family = families[backend]
    matcher = _matcher(family, gated)
    assert isinstance(matcher, Matcher)
    encode = family.tokenizer.encode
    green = encode("green", add_special_tokens=False)
    red = encode("red fox", add_special_tokens=False)
    # At the start: both answers' first tokens are allowed, EOS and a stranger are not.
    allowed = _allowed(matcher, family)
    assert {green[0], red[0]} <= allowed
    assert not set(family.vocab.eos_ids) & allowed
    stranger = encode(" zebra", add_special_tokens=False)[0]
    assert stranger not in allowed
    assert not matcher.accept_token(stranger)  # refused, and the state did not move
    assert not matcher.allows_end() and not matcher.is_terminated()
    assert matcher.distance() >= 0 and not matcher.closing(1000)
    # All or nothing: a sequence that goes wrong halfway moves nothing.
    assert not matcher.accept_tokens([green[0], stranger])
    assert _allowed(matcher, family) == allowed
    # One whole answer ends the output; a rollback returns to where it started.
    assert matcher.accept_tokens(green)
    assert matcher.allows_end() and matcher.is_terminated()
    assert matcher.forced_bytes() == b""
    matcher.rollback(len(green))
    assert not matcher.allows_end()
    assert _allowed(matcher, family) == allowed
    # The other answer, token by token; once "red" is in, " fox" is forced text.
    assert matcher.accept_token(red[0])
    rest = family.tokenizer.decode(red[1:]).encode() if len(red) > 1 else b""
    assert matcher.forced_bytes().startswith(rest)
    assert matcher.accept_tokens(red[1:])
    assert matcher.is_terminated()
