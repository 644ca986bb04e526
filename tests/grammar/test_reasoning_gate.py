"""ReasoningGate: the constraint starts after </think>; rollback crosses the boundary; a
budget closes the section in time for the answer to close too."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from arbor.grammar.constraint import constraint_from_params
from arbor.grammar.reasoning_gate import ReasoningGate
from arbor.kernels.reference import apply_token_bitmask_ref
from tests.grammar.random_walk import Family

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


@pytest.fixture(scope="module")
def family(tiny_model) -> Family:
    from transformers import AutoTokenizer

    fam = Family(AutoTokenizer.from_pretrained(tiny_model("llama")))
    yield fam
    fam.close()


def _gate(family: Family, opens_inside: bool) -> ReasoningGate:
    grammar = family.compiler.compile(constraint_from_params({"json_schema": SCHEMA}))
    ids = [family.tokenizer.encode(m, add_special_tokens=False) for m in ("<think>", "</think>")]
    return ReasoningGate(grammar.matcher(budget_aware=True), ids[0], ids[1], opens_inside)


def _allowed(gate: ReasoningGate, remaining: int | None = None) -> np.ndarray:
    row = np.zeros(gate.grammar.tables.words, dtype=np.int32)
    gate.fill_bitmask(row, remaining)
    return np.flatnonzero(np.unpackbits(row.view(np.uint8), bitorder="little")[: gate.grammar.tables.vocab.logits_size])


def test_free_while_thinking_then_the_schema(family) -> None:
    gate = _gate(family, opens_inside=True)
    eos = family.vocab.eos_ids[0]
    assert len(_allowed(gate)) == family.vocab.logits_size - 1 and eos not in _allowed(gate)
    assert gate.accept_tokens(family.retok.encode(b"free text, not JSON {"))
    assert not gate.allows_end() and gate.forced_bytes() == b""
    assert gate.accept_tokens(family.tokenizer.encode("</think>"))
    assert gate.forced_bytes().startswith(b'{"ok": ')  # the answer: the schema's masks and jumps
    assert not gate.accept_tokens(family.retok.encode(b"hello"))
    assert gate.accept_tokens(family.retok.encode(b'{"ok": true}')) and gate.is_terminated()


def test_rollback_crosses_the_end_marker(family) -> None:
    gate = _gate(family, opens_inside=True)
    end = family.tokenizer.encode("</think>")
    answer = family.retok.encode(b'{"ok": ')
    assert gate.accept_tokens(family.retok.encode(b"hmm") + end + answer)
    gate.rollback(len(answer) + 1)  # back inside the marker: still thinking
    assert gate.forced_bytes() == b"" and gate.accept_tokens(end[-1:]) and gate.forced_bytes().startswith(b'{"ok"')
    assert not gate.accept_tokens([*answer, *family.retok.encode(b"x")])  # all or none
    assert gate.accept_tokens(answer) and gate.forced_bytes() in (b"true}", b"")


def test_qwen3_style_answers_with_or_without_a_section(family) -> None:
    start = family.tokenizer.encode("<think>")
    direct = _gate(family, opens_inside=False)
    assert start[0] in _allowed(direct) and direct.accept_tokens(family.retok.encode(b'{"ok": false}'))
    assert direct.is_terminated()
    thinking = _gate(family, opens_inside=False)
    assert thinking.accept_token(start[0])
    assert list(_allowed(thinking)) == start[1:2]  # the rest of the start marker
    assert thinking.accept_tokens(start[1:] + family.retok.encode(b"plan") + family.tokenizer.encode("</think>"))
    assert thinking.accept_tokens(family.retok.encode(b'{"ok": true}')) and thinking.is_terminated()


@pytest.mark.parametrize("budget", [12, 16, 40])
def test_a_budget_closes_the_section_and_then_the_json(family, budget: int) -> None:
    gate = _gate(family, opens_inside=True)
    gen = torch.Generator().manual_seed(budget)
    out: list[int] = []
    while len(out) < budget and not gate.is_terminated():
        row = np.zeros((1, gate.grammar.tables.words), dtype=np.int32)
        gate.fill_bitmask(row[0], budget - len(out))
        logits = torch.randn(1, family.vocab.logits_size, generator=gen) * 3
        apply_token_bitmask_ref(logits, torch.from_numpy(row))
        tok = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=gen))
        if tok in family.vocab.eos_ids:
            break
        assert gate.accept_token(tok)
        out.append(tok)
    text = b"".join(family.vocab.token_bytes[i] for i in out).decode("utf-8", "replace")  # free bytes may split
    assert "</think>" in text, text
    assert json.loads(text.split("</think>", 1)[1]) in ({"ok": True}, {"ok": False}), text
