"""The compile worker: a child process that builds outlines-core indexes under a memory cap.

`python -m arbor.grammar.worker MEMORY_MB` reads length-prefixed msgpack frames on stdin: first
the serialized vocabulary, then `CompileJob`s; it answers each with a `CompileDone` on
stdout. A regex whose automaton outgrows the cap kills only this process (the parent sees
the pipe close and reports it), never the scheduler.
"""

from __future__ import annotations

import resource
import struct
import sys
from typing import BinaryIO

import msgspec

_HEADER = struct.Struct(">I")


class CompileJob(msgspec.Struct):
    """Build the index of one regex (and, with `sentinel` >= 0, its budget distances)."""

    regex: str
    sentinel: int = -1


class CompileDone(msgspec.Struct):
    """The serialized index and distances (budget.Distances.to_bytes), or the compiler's error."""

    index: bytes = b""
    distances: bytes = b""
    error: str = ""


def write_frame(stream: BinaryIO, payload: bytes) -> None:
    stream.write(_HEADER.pack(len(payload)) + payload)
    stream.flush()


def read_frame(stream: BinaryIO) -> bytes | None:
    """One frame, or None at end of stream."""
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        return None
    size = _HEADER.unpack(head)[0]
    data = stream.read(size)
    return data if len(data) == size else None


def main() -> None:
    limit = int(sys.argv[1]) << 20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    import outlines_core

    from arbor.grammar.budget import Distances

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    blob = read_frame(stdin)
    if blob is None:
        return
    vocabulary = outlines_core.Vocabulary.from_binary(blob)
    decode = msgspec.msgpack.Decoder(CompileJob).decode
    encode = msgspec.msgpack.Encoder().encode
    while (frame := read_frame(stdin)) is not None:
        job = decode(frame)
        try:
            index = outlines_core.Index(job.regex, vocabulary)
            done = CompileDone(index=_index_bytes(index))
            if job.sentinel >= 0:
                done.distances = Distances.build(index, job.sentinel).to_bytes()
        except MemoryError:
            done = CompileDone(error="the automaton outgrew the compiler's memory limit")
        except Exception as exc:  # a regex outlines-core rejects: report its words
            done = CompileDone(error=str(exc) or type(exc).__name__)
        write_frame(stdout, encode(done))


def _index_bytes(index: object) -> bytes:
    """outlines-core's own binary form of an Index (what `Index.from_binary` reads)."""
    _, args = index.__reduce__()  # type: ignore[misc]
    return args[0]


if __name__ == "__main__":
    main()
