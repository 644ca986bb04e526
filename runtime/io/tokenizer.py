"""The one place Arbor loads a tokenizer: the front door, the detokenizer and the grammar
compiler each call `load_tokenizer` once in their own process (so nothing is cached)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def load_tokenizer(path: str | os.PathLike[str]) -> PreTrainedTokenizerBase:
    """The Hugging Face tokenizer (with its chat template) in directory `path`, from local
    files only: never the hub."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(os.fspath(path), local_files_only=True)
