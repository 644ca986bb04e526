"""The evaluation-model tooling: the held-out split is stable and disjoint, a short training
run writes a checkpoint that Arbor and transformers both load, and Arbor's prompt-logprob
perplexity equals transformers' on the same windows (fp32)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import eval_data
import eval_ppl
import make_eval_models


def test_split_is_disjoint_and_mostly_training() -> None:
    files = eval_data.stdlib_files()
    held = [p for p in files if eval_data.is_held_out(p)]
    assert len(files) > 200, "the standard library's sources are there"
    assert 0.02 < len(held) / len(files) < 0.1
    assert all(eval_data.is_held_out(p) for p in held), "the split is a pure function of the path"


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A few steps of a very small recipe, through the same code as the real pair."""
    out = tmp_path_factory.mktemp("eval-mini")
    recipe = make_eval_models.Recipe(layers=1, hidden=32, heads=2, kv_heads=1, intermediate=64, steps=3, lr=1e-3)
    make_eval_models.write_gpt2_tokenizer(out, make_eval_models.MAX_POSITIONS)
    make_eval_models.write_generation_config(out, 50256, 50256)
    make_eval_models.train("mini", recipe, seed=0, out=out)
    return out


def test_training_writes_a_loadable_checkpoint(trained: Path) -> None:
    log = (trained / "train_log.json").read_text()
    assert '"loss"' in log and (trained / "model.safetensors").exists()


def test_arbor_perplexity_equals_transformers(trained: Path) -> None:
    windows = eval_data.heldout_windows(trained, count=3, length=40)
    assert len({tuple(w) for w in windows}) == 3
    ours = eval_ppl.arbor_ppl(trained, windows, dtype="float32", max_total_tokens=4096)
    theirs = eval_ppl.hf_ppl(trained, windows)
    assert ours == pytest.approx(theirs, rel=1e-4)
    assert ours > 1.0
