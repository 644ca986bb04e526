"""Incremental detokenization: multi-byte characters are never split or replaced, stop strings
never leak, for GPT-2's byte-level BPE and Llama-2's SentencePiece (byte fallback)."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer, LlamaTokenizer

from arbor.runtime.detokenizer import IncrementalDetokenizer
from arbor.runtime.messages import ReqOut, pack_ids

LLAMA2 = Path(__file__).resolve().parents[3] / "shared" / "data" / "tokenizers" / "llama2"
TEXT = "Prefix trees 🌳 share KV: héllo wörld, 世界と日本語, ∑ x² ≥ 0 — 🚀🚀 done."


@pytest.fixture(params=["gpt2", "llama2"])
def tokenizer(request, tiny_model):
    if request.param == "gpt2":
        return AutoTokenizer.from_pretrained(tiny_model("llama"))
    if not (LLAMA2 / "tokenizer.model").exists():
        pytest.skip("the Llama-2 tokenizer is not in ../shared/data")
    return LlamaTokenizer.from_pretrained(LLAMA2)


def stream(detok: IncrementalDetokenizer, ids: list[int], stop: list[str]) -> tuple[list[str], dict | None]:
    deltas, reason = [], None
    for i, tok in enumerate(ids):
        last = i == len(ids) - 1
        outs, _ = detok.feed([ReqOut(rid="r", new_ids=pack_ids([tok]), stop=stop,
                                     finish_reason={"type": "length", "length": i + 1} if last else None)])
        for out in outs:
            deltas.append(out.text)
            reason = out.finish_reason or reason
        if reason is not None:
            break
    return deltas, reason


def test_one_token_at_a_time_never_splits_a_character(tokenizer):
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    assert any(len(tokenizer.decode([t])) == 0 or "\ufffd" in tokenizer.decode([t]) for t in ids)  # real splits
    deltas, reason = stream(IncrementalDetokenizer(tokenizer), ids, [])
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == tokenizer.decode(ids, skip_special_tokens=True)
    assert reason == {"type": "length", "length": len(ids)}


def test_stop_string_across_tokens_is_cut_and_never_streamed(tokenizer):
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    deltas, reason = stream(IncrementalDetokenizer(tokenizer), ids, ["世界"])
    text = "".join(deltas)
    assert reason == {"type": "stop", "matched": "世界"}
    assert "世" not in text and text == tokenizer.decode(ids, skip_special_tokens=True).split("世界")[0]
