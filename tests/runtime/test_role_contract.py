"""Every side a scheduler can hold (co-located, prefill, decode) implements the whole `Role`
contract, so the scheduler calls it without a None check; the co-located one holds nothing."""

from __future__ import annotations

import inspect

import pytest

from arbor.runtime.disaggregation.decode import DecodeReceiver
from arbor.runtime.disaggregation.prefill import PrefillSender
from arbor.runtime.disaggregation.role import NullRole, Role

MEMBERS = [name for name in vars(Role) if not name.startswith("_")] + list(Role.__annotations__)


@pytest.mark.parametrize("side", [NullRole, PrefillSender, DecodeReceiver])
def test_every_side_has_every_member_of_the_contract(side):
    missing = [
        m
        for m in MEMBERS
        if m not in dir(side)
        and m not in inspect.signature(side.__init__).parameters
        and "self." + m not in inspect.getsource(side.__init__)
    ]
    assert missing == []


def test_a_co_located_worker_holds_and_moves_nothing():
    role = NullRole()
    assert not role.busy and role.awaiting == 0 and role.sockets == []
    assert role.step(8) == ([], []) and role.abort("any") == []
