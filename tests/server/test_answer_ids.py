"""The chat tokenizer's memory of assistant answers: per tenant, and bounded in bytes."""

from __future__ import annotations

from transformers import AutoTokenizer

from arbor.runtime.server.answer_ids import AnswerIds
from arbor.runtime.server.chat import ChatTokenizer


def test_a_tenant_never_gets_another_tenants_remembered_ids():
    ids = AnswerIds()
    ids.put("tenant-a", "the answer", [5, 6, 7])
    assert ids.get("tenant-a", "the answer") == [5, 6, 7]
    assert ids.get("tenant-b", "the answer") is None and ids.get(None, "the answer") is None


def test_the_memory_stays_under_its_byte_bound_and_forgets_the_oldest():
    ids = AnswerIds(max_bytes=100_000)
    for i in range(1000):
        ids.put("t", f"answer {i} " + "x" * 200, list(range(100)))
        assert ids.nbytes <= 100_000
    assert ids.get("t", "answer 999 " + "x" * 200) == list(range(100))
    assert ids.get("t", "answer 0 " + "x" * 200) is None
    assert 50 < len(ids) < 1000


def test_an_answer_larger_than_the_bound_is_not_kept():
    ids = AnswerIds(max_bytes=1000)
    ids.put("t", "long", list(range(1000)))
    assert ids.get("t", "long") is None and ids.nbytes == 0


def test_the_chat_splices_only_the_callers_own_answers(tiny_model):
    tok = AutoTokenizer.from_pretrained(tiny_model("llama"))
    chat = ChatTokenizer(tok)
    chat.remember("a remembered answer", [7, 8, 9], tenant="tenant-a")
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "a remembered answer"},
        {"role": "user", "content": "and?"},
    ]
    as_text = tok.encode(
        tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True), add_special_tokens=False
    )
    assert [7, 8, 9] not in _windows(as_text, 3)
    assert [7, 8, 9] in _windows(chat.encode(messages, tenant="tenant-a"), 3)
    assert chat.encode(messages, tenant="tenant-b") == as_text


def _windows(ids: list[int], width: int) -> list[list[int]]:
    return [ids[i : i + width] for i in range(len(ids) - width + 1)]
