"""Fixtures: grammar compilers for both tokenizer families (GPT-2 BPE, Llama-2 SentencePiece)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.grammar.random_walk import Family

LLAMA2 = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "tokenizers" / "llama2"


@pytest.fixture(scope="session")
def gpt2_family(tiny_model) -> Family:
    from transformers import AutoTokenizer

    family = Family(AutoTokenizer.from_pretrained(tiny_model("llama")))
    yield family
    family.close()


@pytest.fixture(scope="session")
def llama2_family() -> Family:
    if not (LLAMA2 / "tokenizer.model").exists():
        pytest.skip("the Llama-2 tokenizer is not beside this checkout (../shared/data)")
    from transformers import LlamaTokenizer

    family = Family(LlamaTokenizer.from_pretrained(str(LLAMA2)))
    yield family
    family.close()


@pytest.fixture(scope="session", params=["gpt2", "llama2"])
def family(request) -> Family:
    return request.getfixturevalue(f"{request.param}_family")
