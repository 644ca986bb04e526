"""The docs point at things that exist: every relative link and every backticked repository
path (`runtime/kv/pool.py`, `docs/scale.md`, `tests/radix/`) under docs/ resolves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").rglob("*.md"))
# A backticked path is checked when it starts at one of the repository's own top-level entries.
TOP = {p.name for p in ROOT.iterdir() if not p.name.startswith(".")}
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\s]+)`")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _links(text: str) -> list[str]:
    """Relative link targets, without their #fragment."""
    targets = (t.split("#")[0] for t in LINK.findall(text))
    return [t for t in targets if t and not re.match(r"[a-z]+:", t)]


def _paths(text: str) -> list[str]:
    """Backticked repository paths outside code blocks, without a `:symbol` suffix (a path with a
    `<placeholder>` is a template, not a file)."""
    found = []
    for span in CODE.findall(FENCE.sub("", text)):
        path = span.split(":")[0].rstrip(".,")
        if "/" in path and "<" not in path and path.split("/")[0] in TOP:
            found.append(path)
    return found


def _expand(path: str) -> list[str]:
    """`a_{x,y}.json` -> `a_x.json`, `a_y.json` (one level of braces, as the docs write them)."""
    m = re.search(r"\{([^{}]*)\}", path)
    return [path[: m.start()] + alt + path[m.end() :] for alt in m[1].split(",")] if m else [path]


def _exists(path: str, doc: Path) -> bool:
    for base in (ROOT, doc.parent):
        if all(list(base.glob(p)) if "*" in p else (base / p).exists() for p in _expand(path)):
            return True
    return False


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(ROOT / "docs")))
def test_links_and_paths_in_docs_resolve(doc: Path):
    text = doc.read_text()
    missing = [f"link {t}" for t in _links(text) if not (doc.parent / t).exists()]
    missing += [f"path {p}" for p in _paths(text) if not _exists(p, doc)]
    assert not missing, "\n".join(missing)
