"""No filesystem path of the server in what a client reads: every error message passes through
`public` (ApiError.body) on its way out. The server's log keeps the full text.

Known directories (the model's, the tokenizer's, Python's, Arbor's, the home directory) read as
a label, and a source file anywhere (a C++ or CUDA file named by a native library's error, a
Python file in a traceback) as its name alone.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from arbor.grammar.linear_regex import scanner

# RE2 (Python's re is quadratic on a message holding many "/a"); \pL\pN\pM_ is re's Unicode \w.
_SOURCE_FILE = scanner(r"(?:/[\pL\pN\pM_.+@~-]+)*/([\pL\pN\pM_.+@~-]+\.(?:cc|cpp|cxx|c|h|hpp|cu|cuh|py|rs))\b")
_hidden: dict[str, str] = {}  # directory -> what a client reads instead
_pattern: re.Pattern[str] | None = None


def hide(path: str | Path, label: str) -> None:
    """From now on, the directory `path` reads as `label` in every message a client gets."""
    global _pattern
    resolved = str(Path(path).resolve())
    for p in {str(path).rstrip("/"), resolved}:
        if len(p) > 1:  # never the root directory
            _hidden[p] = label
    names = sorted(_hidden, key=len, reverse=True)  # the longest first: a model under the home directory
    _pattern = re.compile("(?:" + "|".join(re.escape(n) for n in names) + r")(?![\w.+@~-])")


def public(text: str) -> str:
    """`text` without this server's paths."""
    text = _SOURCE_FILE.sub(r"\1", text)
    return text if _pattern is None else _pattern.sub(lambda m: _hidden[m[0]], text)


hide(sys.prefix, "<python>")
hide(sys.base_prefix, "<python>")
hide(Path(__file__).resolve().parents[2], "<arbor>")
hide(Path.home(), "~")
