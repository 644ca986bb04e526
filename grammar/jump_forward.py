"""Jump-forward: turn a forced string into the tokens the model would have seen.

The last sampled token and the forced bytes after it are tokenized together, so a boundary
such as `"` + `: "` comes out as the tokenizer's own merge rather than two fragments. The
text is encoded after a newline anchor (then dropped) so SentencePiece adds no word-start
space; if the result does not spell exactly the bytes wanted, a greedy longest-match over
the vocabulary is used instead.
"""

from __future__ import annotations

from typing import Any

from arbor.grammar.vocabulary import TokenVocabulary

_ANCHOR = "\n"
MAX_JUMP_BYTES = 256  # longest forced string written in one jump


class Retokenizer:
    """Canonical tokens for a byte string, checked against the vocabulary's bytes."""

    def __init__(self, tokenizer: Any, vocab: TokenVocabulary) -> None:
        self.tokenizer = tokenizer
        self.token_bytes = vocab.token_bytes
        self.by_bytes: dict[bytes, int] = {}
        for i, b in enumerate(vocab.token_bytes):
            if b:
                self.by_bytes.setdefault(b, i)
        self.longest = max(len(b) for b in self.by_bytes)
        self.anchor = tokenizer.encode(_ANCHOR, add_special_tokens=False)

    def encode(self, data: bytes) -> list[int]:
        """Tokens spelling exactly `data` (empty list if the vocabulary cannot)."""
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return self.greedy(data)
        ids = self.tokenizer.encode(_ANCHOR + text, add_special_tokens=False)
        if ids[: len(self.anchor)] == self.anchor:
            ids = ids[len(self.anchor) :]
            if b"".join(self.token_bytes[i] or b"\xff\xff" for i in ids) == data:
                return ids
        return self.greedy(data)

    def greedy(self, data: bytes) -> list[int]:
        """Longest vocabulary match at each position."""
        out, i = [], 0
        while i < len(data):
            for size in range(min(self.longest, len(data) - i), 0, -1):
                tok = self.by_bytes.get(data[i : i + size])
                if tok is not None:
                    out.append(tok)
                    i += size
                    break
            else:
                return []
        return out
