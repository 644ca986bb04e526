"""The compile worker: a child process that compiles constraints under a memory cap.

`python -m arbor.grammar.worker MEMORY_MB` reads length-prefixed msgpack frames on stdin: first
a `WorkerInit` (the backend and its serialized vocabulary), answered with an empty frame once
the vocabulary is loaded, then `CompileJob`s; it answers each with a `CompileDone` on stdout. The outlines backend builds an outlines-core Index (and the
budget distances); the xgrammar backend a CompiledGrammar in xgrammar's JSON form. A grammar
that outgrows the cap kills only this process (the parent sees the pipe close and reports
it), never the scheduler.
"""

from __future__ import annotations

import re
import resource
import struct
import sys
from collections.abc import Callable
from typing import IO, Any

import msgspec

_HEADER = struct.Struct(">I")
# xgrammar's log prefix, "[18:55:34] /project/cpp/grammar_parser.cc:820: ": where in its C++
# sources it failed, which tells a client nothing and names paths of the machine that built it.
_LOG_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: ")


class WorkerInit(msgspec.Struct):
    """backend: outlines | xgrammar; vocab: outlines-core's binary Vocabulary, or xgrammar's
    serialized TokenizerInfo."""

    backend: str
    vocab: bytes


class CompileJob(msgspec.Struct):
    """Compile one constraint. outlines: the index of `regex` (and, with `sentinel` >= 0, its
    budget distances); xgrammar: `kind` and `text` (`regex` for regex and choices)."""

    regex: str
    sentinel: int = -1
    kind: str = ""
    text: str = ""


class CompileDone(msgspec.Struct):
    """The serialized index (or xgrammar grammar) and distances (budget.Distances.to_bytes),
    or the compiler's error."""

    index: bytes = b""
    distances: bytes = b""
    error: str = ""


def write_frame(stream: IO[bytes], payload: bytes) -> None:
    stream.write(_HEADER.pack(len(payload)) + payload)
    stream.flush()


def read_frame(stream: IO[bytes]) -> bytes | None:
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
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    frame = read_frame(stdin)
    if frame is None:
        return
    init = msgspec.msgpack.decode(frame, type=WorkerInit)
    compile_one = _xgrammar(init.vocab) if init.backend == "xgrammar" else _outlines(init.vocab)
    write_frame(stdout, b"")  # ready: a job's time limit counts from here
    decode = msgspec.msgpack.Decoder(CompileJob).decode
    encode = msgspec.msgpack.Encoder().encode
    while (frame := read_frame(stdin)) is not None:
        try:
            done = compile_one(decode(frame))
        except MemoryError:
            done = CompileDone(error="the grammar outgrew the compiler's memory limit")
        except Exception as exc:  # a constraint the backend rejects: report its words
            done = CompileDone(error=_words(exc))
        write_frame(stdout, encode(done))


def _words(exc: Exception) -> str:
    """The first line of a backend's error, without its source location (at most 500 characters)."""
    return _LOG_PREFIX.sub("", str(exc).strip().split("\n")[0])[:500] or type(exc).__name__


def _outlines(blob: bytes) -> Callable[[CompileJob], CompileDone]:
    import outlines_core

    from arbor.grammar.budget import Distances

    vocabulary = outlines_core.Vocabulary.from_binary(blob)

    def compile_one(job: CompileJob) -> CompileDone:
        index = outlines_core.Index(job.regex, vocabulary)
        done = CompileDone(index=_index_bytes(index))
        if job.sentinel >= 0:
            done.distances = Distances.build(index, job.sentinel).to_bytes()
        return done

    return compile_one


def _xgrammar(info_json: bytes) -> Callable[[CompileJob], CompileDone]:
    import xgrammar

    from arbor.grammar.backends.xgrammar import compile_source

    info = xgrammar.TokenizerInfo.deserialize_json(info_json.decode())
    compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)

    def compile_one(job: CompileJob) -> CompileDone:
        grammar = compile_source(compiler, job.kind, job.text, job.regex)
        return CompileDone(index=grammar.serialize_json().encode())

    return compile_one


def _index_bytes(index: Any) -> bytes:
    """outlines-core's own binary form of an Index (what `Index.from_binary` reads)."""
    _, args = index.__reduce__()
    return args[0]


if __name__ == "__main__":
    main()
