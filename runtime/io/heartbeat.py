"""Heartbeats: the scheduler and the detokenizer stamp a shared slot with the monotonic clock
each time their loop comes around, and the front door calls a process stalled when its stamp
grows too old. An idle loop still comes around every second (it waits with a timeout), so an
idle server stays healthy; a loop stuck in one step (or a stopped process) does not.

The slots are an mmap of a small file in the runtime's private IPC directory: one int64 of
monotonic nanoseconds per process, 0 until its loop first runs. CLOCK_MONOTONIC is one clock
for every process on the machine.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from pathlib import Path

ROLES = ("scheduler", "detokenizer")  # the processes with a loop of their own to watch
_SLOT = struct.Struct("q")


class HeartbeatBoard:
    """The front door's side: creates the slots, and names a process whose loop stopped."""

    def __init__(self, path: Path) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, bytes(_SLOT.size * len(ROLES)))
            self._map = mmap.mmap(fd, 0)
        finally:
            os.close(fd)  # the mapping stays valid without the descriptor
        self.path = path

    def stalled(self, timeout_s: float) -> str | None:
        """A message naming the first process whose loop has not come around in `timeout_s`."""
        now = time.monotonic_ns()
        for i, role in enumerate(ROLES):
            (stamp,) = _SLOT.unpack_from(self._map, i * _SLOT.size)
            age = (now - stamp) / 1e9
            if stamp and age > timeout_s:
                return (
                    f"the {role} process has made no progress for {age:.0f} s "
                    f"(--health-heartbeat-timeout-s is {timeout_s:g})"
                )
        return None

    def close(self) -> None:
        self._map.close()


class Heartbeat:
    """A child's side: `beat()` stamps its role's slot (a few hundred nanoseconds)."""

    def __init__(self, path: str, role: str) -> None:
        fd = os.open(path, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, 0)
        finally:
            os.close(fd)
        self._offset = ROLES.index(role) * _SLOT.size

    def beat(self) -> None:
        _SLOT.pack_into(self._map, self._offset, time.monotonic_ns())
