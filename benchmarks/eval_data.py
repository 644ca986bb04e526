"""Text every machine has, for the evaluation models: the Python standard library's own sources.

Files are split by a hash of their path (1 in 20 held out), so the split is the same on every
machine with the same Python; each file becomes its GPT-2 tokens followed by <|endoftext|>.
"""

from __future__ import annotations

import hashlib
import sys
import sysconfig
from pathlib import Path

HELD_OUT_EVERY = 20  # one file in this many is held out
SKIP_DIRS = {"site-packages", "test", "tests", "idle_test", "__pycache__"}


def stdlib_files() -> list[Path]:
    """The standard library's .py files (no tests, no third-party packages), sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.rglob("*.py") if not SKIP_DIRS & set(p.relative_to(root).parts))


def is_held_out(path: Path) -> bool:
    root = Path(sysconfig.get_paths()["stdlib"])
    digest = hashlib.sha1(str(path.relative_to(root)).encode()).hexdigest()
    return int(digest[:8], 16) % HELD_OUT_EVERY == 0


def corpus_tag() -> str:
    """Names the corpus: the Python version whose standard library it is."""
    return f"py{sys.version_info.major}.{sys.version_info.minor}"


def tokenize_split(tokenizer_dir: Path, held_out: bool) -> list[list[int]]:
    """Token ids of each file of one split, each ending with <|endoftext|>."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    eos = tok.token_to_id("<|endoftext|>")
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in stdlib_files() if is_held_out(p) == held_out]
    return [[*enc.ids, eos] for enc in tok.encode_batch(texts)]


def heldout_windows(tokenizer_dir: Path, count: int, length: int) -> list[list[int]]:
    """`count` disjoint windows of `length` tokens from the held-out files, in file order."""
    return _windows(tokenizer_dir, count, length, held_out=True)


def train_windows(tokenizer_dir: Path, count: int, length: int) -> list[list[int]]:
    """`count` disjoint windows from the training files (calibration data for quantizers)."""
    return _windows(tokenizer_dir, count, length, held_out=False)


def _windows(tokenizer_dir: Path, count: int, length: int, held_out: bool) -> list[list[int]]:
    stream = [t for ids in tokenize_split(tokenizer_dir, held_out=held_out) for t in ids]
    if len(stream) < count * length:
        raise ValueError(f"the split has {len(stream)} tokens; {count} x {length} do not fit")
    stride = len(stream) // count
    return [stream[i * stride : i * stride + length] for i in range(count)]
