"""GrammarCompiler: constraint -> CompiledGrammar, off the scheduler's thread, bounded.

A thread pool drives worker processes (grammar/worker.py), one per thread, so a compile
never blocks the scheduler loop, a slow one is killed at the time limit and a huge one dies
alone at the memory cap. Every regex is compiled as `(?:R)\\x00`: outlines-core 0.2.14 drops
tokens that end one byte past a point where R may already end (it rejects "." after "3" in
`[0-9]+(\\.[0-9]+)?`); with the sentinel no point inside R is final, and the sentinel token
stands for "may end here" (EOS) in the masks. Results live in an LRU bounded in bytes and,
optionally, on disk keyed by (kind, text, vocabulary).
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import select
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import msgspec
import outlines_core

from arbor.grammar.budget import Distances
from arbor.grammar.constraint import Constraint, plan
from arbor.grammar.matcher import CompiledGrammar, VocabTables
from arbor.grammar.vocabulary import TokenVocabulary
from arbor.grammar.worker import CompileDone, CompileJob, read_frame, write_frame

logger = logging.getLogger(__name__)


class GrammarError(ValueError):
    """A constraint that could not be compiled: invalid, too slow or too big."""


class GrammarBusy(GrammarError):
    """Too many constraints are compiling already; the request may retry shortly."""


@dataclass
class CompilerConfig:
    """Limits of the compile service (ServerArgs.grammar_* flags)."""

    workers: int = 2
    timeout_s: float = 10.0
    memory_mb: int = 4096
    cache_mb: int = 512
    cache_dir: str | None = None
    max_pending: int = 64  # distinct constraints compiling or queued; more are refused (GrammarBusy)
    failed_cache: int = 1024  # failed constraints remembered, so a resend fails at once


class _Worker:
    """One compile worker process, restarted after it is killed or dies."""

    def __init__(self, vocab_blob: bytes, memory_mb: int) -> None:
        self.vocab_blob = vocab_blob
        self.memory_mb = memory_mb
        self.proc: subprocess.Popen | None = None
        self.encode = msgspec.msgpack.Encoder().encode
        self.decode = msgspec.msgpack.Decoder(CompileDone).decode

    def compile(self, job: CompileJob, timeout_s: float) -> CompileDone:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        proc = self.proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        try:
            write_frame(proc.stdin, self.encode(job))
        except BrokenPipeError:
            return self._died()
        ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
        if not ready:
            self.kill()
            raise GrammarError(f"compiling the constraint took longer than {timeout_s:g} s; simplify it "
                               "(fewer optional properties, smaller bounds) or raise --grammar-compile-timeout-s")
        frame = read_frame(proc.stdout)
        if frame is None:
            return self._died()
        done = self.decode(frame)
        if done.error:
            raise GrammarError(f"the constraint's regex does not compile: {done.error}")
        return done

    def _died(self) -> CompileDone:
        code = self.proc.wait() if self.proc else None
        self.proc = None
        raise GrammarError(f"compiling the constraint needed more than the {self.memory_mb} MB compile memory "
                           f"limit (worker exit {code}); simplify the constraint or raise --grammar-max-memory-mb")

    def _start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "arbor.grammar.worker", str(self.memory_mb)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )
        assert self.proc.stdin is not None
        write_frame(self.proc.stdin, self.vocab_blob)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


class GrammarCompiler:
    """Compiles constraints for one vocabulary; `submit` returns a Future of CompiledGrammar
    (its exception is a GrammarError with a message for the user)."""

    def __init__(self, vocab: TokenVocabulary, config: CompilerConfig | None = None) -> None:
        self.config = config or CompilerConfig()
        self.tables = VocabTables.build(vocab)
        blob = vocab.outlines().__reduce__()[1][0]
        self.vocab_digest = hashlib.sha256(blob).hexdigest()[:16]
        self._workers: queue.Queue[_Worker] = queue.Queue()
        for _ in range(self.config.workers):
            self._workers.put(_Worker(blob, self.config.memory_mb))
        self._pool = ThreadPoolExecutor(self.config.workers, thread_name_prefix="grammar")
        self._lock = threading.Lock()
        self._cache: OrderedDict[Constraint, CompiledGrammar] = OrderedDict()
        self._cache_bytes = 0
        self._pending: dict[Constraint, Future] = {}
        self._failed: OrderedDict[Constraint, str] = OrderedDict()  # constraint -> its error message
        self.stats = {"compiles": 0, "cache_hits": 0, "disk_hits": 0, "errors": 0, "compile_s": 0.0}

    def submit(self, constraint: Constraint) -> Future:
        """A Future of the compiled grammar (done at once on a cache hit)."""
        with self._lock:
            grammar = self._cache.get(constraint)
            if grammar is not None:
                self._cache.move_to_end(constraint)
                self.stats["cache_hits"] += 1
                done: Future = Future()
                done.set_result(grammar)
                return done
            failed = self._failed.get(constraint)
            if failed is not None:  # a resent bad constraint must not hold a worker again
                self._failed.move_to_end(constraint)
                return _failed_future(GrammarError(failed))
            if constraint in self._pending:
                return self._pending[constraint]
            if len(self._pending) >= self.config.max_pending:
                return _failed_future(GrammarBusy(
                    f"{len(self._pending)} constraints are compiling already (the limit); retry shortly"))
            future = self._pool.submit(self._compile, constraint)
            self._pending[constraint] = future
            return future

    def compile(self, constraint: Constraint) -> CompiledGrammar:
        """Blocking form of `submit`."""
        return self.submit(constraint).result()

    def close(self) -> None:
        """Stop the pool and kill the worker processes."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        while not self._workers.empty():
            self._workers.get().kill()

    def _compile(self, constraint: Constraint) -> CompiledGrammar:
        try:
            start = time.perf_counter()
            try:
                regex_plan = plan(constraint)
            except ValueError as exc:
                raise GrammarError(str(exc)) from None
            done = self._disk_get(constraint)
            if done is None:
                # JSON is budget-aware by default: its distances are built in the worker too.
                sentinel = self.tables.sentinel if constraint.kind in ("json_schema", "json_object") else -1
                worker = self._workers.get()
                try:
                    done = worker.compile(CompileJob(f"(?:{regex_plan.regex})\\x00", sentinel), self.config.timeout_s)
                finally:
                    self._workers.put(worker)
                self._disk_put(constraint, done)
            else:
                self.stats["disk_hits"] += 1
            index = outlines_core.Index.from_binary(done.index)
            distances = Distances.from_bytes(done.distances) if done.distances else None
            grammar = CompiledGrammar(index, self.tables, regex_plan.unenforced, len(done.index), distances)
            self.stats["compiles"] += 1
            self.stats["compile_s"] += time.perf_counter() - start
            self._remember(constraint, grammar)
            return grammar
        except GrammarError as exc:
            self.stats["errors"] += 1
            with self._lock:
                self._failed[constraint] = str(exc)
                while len(self._failed) > self.config.failed_cache:
                    self._failed.popitem(last=False)
            raise
        finally:
            with self._lock:
                self._pending.pop(constraint, None)

    def _remember(self, constraint: Constraint, grammar: CompiledGrammar) -> None:
        limit = self.config.cache_mb << 20
        with self._lock:
            self._cache[constraint] = grammar
            self._cache_bytes += grammar.size_bytes
            while self._cache_bytes > limit and len(self._cache) > 1:
                _, old = self._cache.popitem(last=False)
                self._cache_bytes -= old.size_bytes

    def _disk_path(self, constraint: Constraint) -> Path | None:
        if not self.config.cache_dir:
            return None
        key = hashlib.sha256(f"{constraint.kind}\0{constraint.text}\0{self.vocab_digest}".encode()).hexdigest()
        return Path(self.config.cache_dir) / f"{key}.grammar"

    def _disk_get(self, constraint: Constraint) -> CompileDone | None:
        path = self._disk_path(constraint)
        if path is None or not path.exists():
            return None
        return msgspec.msgpack.decode(path.read_bytes(), type=CompileDone)

    def _disk_put(self, constraint: Constraint, done: CompileDone) -> None:
        path = self._disk_path(constraint)
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(msgspec.msgpack.encode(done))
        tmp.replace(path)


def _failed_future(exc: Exception) -> Future:
    future: Future = Future()
    future.set_exception(exc)
    return future
