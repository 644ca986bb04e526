"""The code in docs/contributing.md runs, and does what the page says: the prefix-cache
example passes every prefix-cache contract test."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.radix import test_prefix_cache_contract as contract

DOC = Path(__file__).resolve().parents[1] / "docs" / "contributing.md"


def _section_code(heading: str) -> str:
    text = DOC.read_text()
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return "\n".join(re.findall(r"```python\n(.*?)```", section, re.S))


@pytest.mark.parametrize("page_size", [1, 4])
def test_the_prefix_cache_example_keeps_the_contract(page_size):
    namespace: dict[str, object] = {}
    exec(compile(_section_code("Add a prefix-cache implementation"), str(DOC), "exec"), namespace)
    make = namespace["CountingCache"]
    checks = [f for name, f in vars(contract).items() if name.startswith("test_") and callable(f)]
    assert len(checks) >= 10
    for check in checks:
        check(make(page_size))  # type: ignore[operator]
    cache = make(page_size)  # type: ignore[operator]
    cache.insert(list(range(8)), list(range(100, 108)))
    assert cache.evict(8, lambda slots: None) == 8 and cache.evicted_tokens == 8
