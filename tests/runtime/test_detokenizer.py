"""Incremental detokenization: multi-byte characters are never split or replaced, stop strings
and regexes never leak (unless no_stop_trim), for GPT-2's byte-level BPE and Llama-2's
SentencePiece (byte fallback)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from transformers import AutoTokenizer, LlamaTokenizer

from arbor.runtime.io.detokenizer import IncrementalDetokenizer
from arbor.runtime.io.messages import (
    FinishLength,
    FinishReason,
    FinishStop,
    OutputOptions,
    ReqOut,
    pack_ids,
)

LLAMA2 = Path(__file__).resolve().parents[3] / "shared" / "data" / "tokenizers" / "llama2"
TEXT = "Prefix trees 🌳 share KV: héllo wörld, 世界と日本語, ∑ x² ≥ 0 — 🚀🚀 done."


@pytest.fixture(params=["gpt2", "llama2"])
def tokenizer(request, tiny_model):
    if request.param == "gpt2":
        return AutoTokenizer.from_pretrained(tiny_model("llama"))
    if not (LLAMA2 / "tokenizer.model").exists():
        pytest.skip("the Llama-2 tokenizer is not in ../shared/data")
    return LlamaTokenizer.from_pretrained(LLAMA2)


def stream(
    detok: IncrementalDetokenizer, ids: list[int], stop: list[str], last_reason: FinishReason | None = None, **options
) -> tuple[list[str], FinishReason | None]:
    deltas, reason = [], None
    output = OutputOptions(stop=stop, **options)
    for i, tok in enumerate(ids):
        last = i == len(ids) - 1
        end = (last_reason or FinishLength(length=i + 1)) if last else None
        outs, _ = detok.feed([ReqOut(rid="r", new_ids=pack_ids([tok]), output=output, finish_reason=end)])
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
    assert reason == FinishLength(length=len(ids))


def test_stop_string_across_tokens_is_cut_and_never_streamed(tokenizer):
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    deltas, reason = stream(IncrementalDetokenizer(tokenizer), ids, ["世界"])
    text = "".join(deltas)
    assert reason == FinishStop(matched="世界")
    assert "世" not in text and text == tokenizer.decode(ids, skip_special_tokens=True).split("世界")[0]


def test_stop_regex_ends_at_its_first_match_and_no_stop_trim_keeps_it(tokenizer):
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    full = tokenizer.decode(ids, skip_special_tokens=True)
    deltas, reason = stream(IncrementalDetokenizer(tokenizer), ids, [], stop_regex=[r"w.rld"], stop_regex_max_len=5)
    assert reason == FinishStop(matched="wörld") and "".join(deltas) == full.split("wörld")[0]
    deltas, reason = stream(IncrementalDetokenizer(tokenizer), ids, ["世界"], no_stop_trim=True)
    assert reason == FinishStop(matched="世界") and "".join(deltas) == full.split("世界")[0] + "世界"


def test_special_tokens_are_kept_only_when_asked_and_a_stop_token_is_trimmed(tiny_model):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model("llama"))
    eos = tokenizer.eos_token_id
    ids = [*tokenizer.encode("a"), eos, *tokenizer.encode(" b"), eos]
    kept, _ = stream(IncrementalDetokenizer(tokenizer), ids, [], FinishStop(matched=eos), skip_special_tokens=False)
    assert "".join(kept) == "a<|endoftext|> b"  # the final stop token is trimmed, the inner one kept
    skipped, _ = stream(IncrementalDetokenizer(tokenizer), ids, [], FinishStop(matched=eos))
    assert "".join(skipped) == "a b"
    untrimmed, _ = stream(
        IncrementalDetokenizer(tokenizer),
        ids,
        [],
        FinishStop(matched=eos),
        skip_special_tokens=False,
        no_stop_trim=True,
    )
    assert "".join(untrimmed) == "a<|endoftext|> b<|endoftext|>"


@pytest.mark.parametrize("pattern", [r"(a|aa)+b$", r"(a+)+b", r"(a*)*$x"])
def test_a_catastrophic_stop_regex_on_a_long_forced_output_stays_linear(tiny_model, pattern):
    # On a backtracking engine each of these takes exponential time on a run of "a"s.
    tokenizer = AutoTokenizer.from_pretrained(tiny_model("llama"))
    a = tokenizer.encode("a", add_special_tokens=False)
    output = OutputOptions(stop_regex=[pattern], stop_regex_max_len=256)
    detok = IncrementalDetokenizer(tokenizer)
    started = time.perf_counter()
    for i in range(4000):
        outs, stopped = detok.feed(
            [
                ReqOut(
                    rid="r",
                    new_ids=pack_ids(a),
                    output=output,
                    finish_reason=FinishLength(length=i + 1) if i == 3999 else None,
                )
            ]
        )
        assert not stopped
    assert time.perf_counter() - started < 2.0
    assert outs[0].finish_reason == FinishLength(length=4000)


def test_the_stop_regex_window_keeps_anchors_and_word_boundaries_of_the_whole_text(tiny_model):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model("llama"))

    def stops(pattern: str, steps: list[str]) -> bool:
        # Width 0: each step's window starts exactly at its new text, one character after the old.
        output = OutputOptions(stop_regex=[pattern], stop_regex_max_len=0)
        detok = IncrementalDetokenizer(tokenizer)
        for piece in steps:
            _, stopped = detok.feed([ReqOut(rid="r", new_ids=pack_ids(tokenizer.encode(piece)), output=output)])
        return bool(stopped)

    assert stops(r"\bcat", ["the ", "cat"]) and not stops(r"\bcat", ["con", "cat"])
    assert stops(r"^cat", ["cat"]) and not stops(r"^cat", ["a", "cat"])
    assert stops(r"(?m)^cat", ["a\n", "cat"])
