"""Token bitsets: int32 rows over the logits (bit t of word t // 32 = token t allowed), and
the per-vocabulary tables every grammar backend shares (EOS ids, first bytes, the sentinel)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from arbor.grammar.vocabulary import TokenVocabulary


@dataclass
class VocabTables:
    """Per-vocabulary arrays every grammar of that vocabulary shares."""

    vocab: TokenVocabulary
    words: int  # int32 words per mask row
    index_words: int  # words outlines-core writes (its vocabulary may be wider than the logits)
    sentinel: int
    eos_ids: np.ndarray
    first_bytes: np.ndarray  # [logits] first byte of each token, -1 if none
    starts_with: np.ndarray  # [256, words] int32 bitsets: tokens whose first byte is b
    byte_tokens: dict[int, int]

    @classmethod
    def build(cls, vocab: TokenVocabulary) -> VocabTables:
        words = -(-vocab.logits_size // 32)
        first = vocab.first_bytes()
        ids = np.flatnonzero(first >= 0)
        bits = np.zeros((256, words * 32), dtype=bool)
        bits[first[ids], ids] = True
        starts = np.packbits(bits, axis=1, bitorder="little").view("<i4")
        return cls(
            vocab,
            words,
            max(words, -(-len(vocab.token_bytes) // 32)),
            vocab.sentinel_id,
            np.array(vocab.eos_ids, dtype=np.int64),
            first,
            starts,
            vocab.byte_tokens(),
        )

    def forced_byte(self, row: np.ndarray) -> int:
        """The first byte shared by every token allowed in `row`, or -1."""
        nonzero = np.flatnonzero(row)
        if not len(nonzero):
            return -1
        word = int(row[nonzero[0]]) & 0xFFFFFFFF
        b = int(self.first_bytes[int(nonzero[0]) * 32 + (word & -word).bit_length() - 1])
        return b if b >= 0 and not (row & ~self.starts_with[b]).any() else -1


def has_bit(row: np.ndarray, token: int) -> bool:
    return bool((int(row[token >> 5]) >> (token & 31)) & 1)


def set_bits(row: np.ndarray, tokens: np.ndarray | list[int], on: bool) -> None:
    """Turn the bits of `tokens` on (or off) in the int32 bitset `row`."""
    for token in np.asarray(tokens).tolist():
        word = int(row[token >> 5]) & 0xFFFFFFFF
        word = word | (1 << (token & 31)) if on else word & ~(1 << (token & 31))
        row[token >> 5] = np.uint32(word).view(np.int32)
