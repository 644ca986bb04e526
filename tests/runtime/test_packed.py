"""oneDNN-packed bf16 linears give the same bits as F.linear at every batch size, and a bf16
model generates the same tokens with and without packing."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from arbor.runtime.config import ServerArgs
from arbor.runtime.io.messages import TokenizedGenerateReq, pack_ids, unpack_ids
from arbor.runtime.model import runner
from arbor.runtime.model.packed_linear import PackedLinear, can_pack, pack_linears
from arbor.runtime.sampling.params import SamplingParams
from arbor.runtime.scheduler.scheduler import Scheduler

pytestmark = pytest.mark.skipif(not can_pack(torch.bfloat16, torch.device("cpu")), reason="no oneDNN")


@pytest.mark.parametrize("rows", [1, 7, 64, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_equals_f_linear_bit_for_bit(rows: int, bias: bool) -> None:
    gen = torch.Generator().manual_seed(rows)
    w = torch.randn(96, 80, generator=gen).bfloat16()
    b = torch.randn(96, generator=gen).bfloat16() if bias else None
    x = torch.randn(rows, 80, generator=gen).bfloat16()
    assert torch.equal(PackedLinear(w, b)(x), F.linear(x, w, b))
    strided = torch.randn(rows, 160, generator=gen).bfloat16()[:, ::2]
    assert torch.equal(PackedLinear(w, b)(strided), F.linear(strided, w, b))


def _generate(model: str, monkeypatch: pytest.MonkeyPatch, packed: bool) -> list[list[int]]:
    monkeypatch.setattr(runner, "can_pack", lambda *a: packed)
    sched = Scheduler(ServerArgs.from_flags(device="cpu", dtype="bfloat16"), model)
    for i, prompt in enumerate([[5, 6, 7], list(range(10, 60)), [300] * 9]):
        sched.add(
            TokenizedGenerateReq(
                rid=str(i),
                input_ids=pack_ids(prompt),
                sampling=SamplingParams(max_new_tokens=10, temperature=0, ignore_eos=True),
            )
        )
    tokens: dict[str, list[int]] = {}
    while sched.has_work:
        for out in sched.step():
            tokens.setdefault(out.rid, []).extend(unpack_ids(out.new_ids).tolist())
    return [tokens[str(i)] for i in range(3)]


@pytest.mark.parametrize("tied", [False, True])
def test_a_packed_bf16_model_generates_the_same_tokens(tiny_model, monkeypatch, tied: bool) -> None:
    model = str(tiny_model("llama-tied-gqa4" if tied else "llama"))
    assert _generate(model, monkeypatch, True) == _generate(model, monkeypatch, False)


def test_pack_linears_swaps_every_linear_and_packs_a_tied_head() -> None:
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).bfloat16()
    assert pack_linears(net) == 2
    assert all(isinstance(net[i], PackedLinear) for i in (0, 2))
