"""Fixtures: grammar compilers for both tokenizer families (GPT-2 BPE, Llama-2 SentencePiece)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from grammar import CompilerConfig, GrammarCompiler, GrammarMatcher, Retokenizer, TokenVocabulary
from grammar.constraint import constraint_from_params
from kernels.bitmask import apply_token_bitmask_ref

LLAMA2 = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "tokenizers" / "llama2"


class Family:
    """A tokenizer with its vocabulary, compiler and retokenizer."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.vocab = TokenVocabulary.from_tokenizer(tokenizer, [tokenizer.eos_token_id])
        self.compiler = GrammarCompiler(self.vocab, CompilerConfig(workers=2, timeout_s=10))
        self.retok = Retokenizer(tokenizer, self.vocab)

    def walk(self, params: dict, seed: int, max_tokens: int = 4000) -> tuple[str, bool, int]:
        """Sample with random logits (temperature 1 over a random model, in effect) under the
        constraint, jumping forward where forced. Returns (text, ended, forced tokens)."""
        grammar = self.compiler.compile(constraint_from_params(dict(params)))
        matcher = GrammarMatcher(grammar)
        gen = torch.Generator().manual_seed(seed)
        mask = np.zeros((1, grammar.tables.words), dtype=np.int32)
        out: list[int] = []
        forced = 0
        eos = set(self.vocab.eos_ids)
        while len(out) < max_tokens:
            if matcher.is_terminated():
                return self.text(out), True, forced
            jump = matcher.forced_bytes()
            if jump:
                ids = self.retok.encode(jump)
                assert ids and matcher.accept_tokens(ids), (jump, ids)
                out += ids
                forced += len(ids)
                continue
            matcher.fill_bitmask(mask[0])
            logits = torch.randn(1, self.vocab.logits_size, generator=gen) * 3
            apply_token_bitmask_ref(logits, torch.from_numpy(mask))
            tok = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=gen))
            if tok in eos:
                assert matcher.allows_end()
                return self.text(out), True, forced
            assert matcher.accept_token(tok)
            out.append(tok)
        return self.text(out), False, forced

    def text(self, ids: list[int]) -> str:
        return b"".join(self.vocab.token_bytes[i] for i in ids).decode("utf-8")


@pytest.fixture(scope="session")
def gpt2_family(tiny_model) -> Family:
    from transformers import AutoTokenizer

    family = Family(AutoTokenizer.from_pretrained(tiny_model("llama")))
    yield family
    family.compiler.close()


@pytest.fixture(scope="session")
def llama2_family() -> Family:
    if not (LLAMA2 / "tokenizer.model").exists():
        pytest.skip("the Llama-2 tokenizer is not beside this checkout (../shared/data)")
    from transformers import LlamaTokenizer

    family = Family(LlamaTokenizer.from_pretrained(str(LLAMA2)))
    yield family
    family.compiler.close()


@pytest.fixture(scope="session", params=["gpt2", "llama2"])
def family(request) -> Family:
    return request.getfixturevalue(f"{request.param}_family")
