"""TokenVocabulary: the bytes each token id stands for, read from any Hugging Face tokenizer.

Byte-level BPE (GPT-2, Llama 3, Qwen) spells bytes with printable stand-in characters;
SentencePiece (Llama 2, Mistral) writes spaces as `▁` and unknown bytes as `<0xNN>`. Both
map back to exact bytes here, which is what the token FSM walks. Special tokens (EOS, BOS,
chat markers) get no bytes: a grammar never allows them, except EOS where it may end.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import outlines_core

SENTINEL = b"\x00"  # ends every compiled regex; see grammar/compiler.py
_BYTE_PIECE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def _byte_level_table() -> dict[str, int]:
    """GPT-2's reversible map from the printable stand-in character to the byte it encodes."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in table.values():
            table[chr(256 + extra)] = b
            extra += 1
    return table


@dataclass
class TokenVocabulary:
    """Bytes of every token id (None for special tokens), plus the EOS ids and logits width."""

    token_bytes: list[bytes | None]
    eos_ids: list[int]
    logits_size: int  # the model's vocabulary size (may exceed the tokenizer's)

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, eos_ids: list[int], logits_size: int | None = None) -> TokenVocabulary:
        """Read a transformers tokenizer; `eos_ids` are the ids that end generation."""
        vocab: dict[str, int] = tokenizer.get_vocab()
        special = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}))
        size = max(max(vocab.values()) + 1, logits_size or 0)
        byte_level = _is_byte_level(tokenizer, vocab)
        table = _byte_level_table()
        token_bytes: list[bytes | None] = [None] * size
        for piece, i in vocab.items():
            if i in special:
                continue
            if byte_level:
                if all(c in table for c in piece):
                    token_bytes[i] = bytes(table[c] for c in piece)
                continue
            m = _BYTE_PIECE.match(piece)
            token_bytes[i] = bytes([int(m.group(1), 16)]) if m else piece.replace("▁", " ").encode()
        return cls(token_bytes, sorted(set(eos_ids)), logits_size or size)

    @property
    def sentinel_id(self) -> int:
        """The one-byte token for b'\\x00' that marks where a compiled regex may end."""
        for i, b in enumerate(self.token_bytes):
            if b == SENTINEL:
                return i
        raise ValueError("this tokenizer has no token for the byte 0x00, which constrained decoding needs")

    def outlines(self) -> outlines_core.Vocabulary:
        """The outlines-core vocabulary: every non-special token, keyed by its bytes. Tokens
        with a NUL byte other than the sentinel are left out, so only the sentinel ends a match."""
        groups: dict[bytes, list[int]] = {}
        for i, b in enumerate(self.token_bytes):
            if b and (b == SENTINEL or SENTINEL not in b):
                groups.setdefault(b, []).append(i)
        marker = self.eos_ids[0] if self.eos_ids else len(self.token_bytes)
        return outlines_core.Vocabulary(marker, groups)

    def first_bytes(self) -> np.ndarray:
        """First byte of each token, -1 for tokens without bytes (for jump-forward)."""
        out = np.full(self.logits_size, -1, dtype=np.int16)
        for i, b in enumerate(self.token_bytes):
            if b:
                out[i] = b[0]
        return out

    def byte_tokens(self) -> dict[int, int]:
        """byte value -> the id of the token that is exactly that one byte."""
        out: dict[int, int] = {}
        for i, b in enumerate(self.token_bytes):
            if b is not None and len(b) == 1:
                out.setdefault(b[0], i)
        return out


def _is_byte_level(tokenizer: Any, vocab: dict[str, int]) -> bool:
    """Whether the tokenizer spells bytes GPT-2 style (a ByteLevel decoder), not SentencePiece."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and "ByteLevel" in type(backend.decoder).__name__:
        return True
    return "Ġ" in "".join(list(vocab)[:5000]) and "▁" not in "".join(list(vocab)[:5000])
