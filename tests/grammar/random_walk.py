"""Random valid outputs of a constraint: sample with random logits under the grammar's
masks, jumping forward where text is forced. Property tests and bench_grammar use it to
check that everything a grammar lets through validates, for any tokenizer."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from arbor.grammar.compiler import CompilerConfig, GrammarCompiler
from arbor.grammar.constraint import constraint_from_params
from arbor.grammar.jump_forward import Retokenizer
from arbor.grammar.vocabulary import TokenVocabulary
from arbor.kernels.reference import apply_token_bitmask_ref


class Family:
    """A tokenizer with its vocabulary, compiler (on one grammar backend) and retokenizer."""

    def __init__(self, tokenizer: Any, backend: str = "outlines") -> None:
        self.tokenizer = tokenizer
        self.vocab = TokenVocabulary.from_tokenizer(tokenizer, [tokenizer.eos_token_id])
        self.compiler = GrammarCompiler(
            self.vocab,
            CompilerConfig(backend=backend, workers=2, timeout_s=10),
            encode=lambda text: tokenizer.encode(text, add_special_tokens=False),
        )
        self.retok = Retokenizer(tokenizer, self.vocab)

    def walk(self, params: dict, seed: int, max_tokens: int = 4000) -> tuple[str, bool, int]:
        """Sample with random logits (temperature 1 over a random model, in effect) under the
        constraint, jumping forward where forced. Returns (text, ended, forced tokens)."""
        grammar = self.compiler.compile(constraint_from_params(dict(params), self.compiler.config.backend))
        matcher = grammar.matcher()
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

    def close(self) -> None:
        self.compiler.close()
