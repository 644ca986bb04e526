"""GrammarCompiler: constraint -> compiled grammar, off the scheduler's thread, bounded.

Three backends (`CompilerConfig.backend`): outlines (Arbor's schema->regex over an
outlines-core automaton; the default), xgrammar and llguidance (pushdown automata, so also
EBNF and structural tags). A constraint kind the chosen backend cannot express (EBNF and
structural tags on outlines) goes to xgrammar (`backend_for`).

A thread pool drives worker processes (grammar/worker.py), one per thread, so a compile
never blocks the scheduler loop, a slow one is killed at the time limit and a huge one dies
alone at the memory cap; llguidance, fuel-bounded and GIL-free, builds on the pool's thread
(grammar/backends/llguidance.py). Every outlines regex is compiled as `(?:R)\\x00`:
outlines-core 0.2.14 drops tokens that end one byte past a point where R may already end (it
rejects "." after "3" in `[0-9]+(\\.[0-9]+)?`); with the sentinel no point inside R is final,
and the sentinel token stands for "may end here" (EOS) in the masks. Results live in an LRU
bounded in bytes and, optionally, on disk keyed by (backend, kind, text, vocabulary).
"""

from __future__ import annotations

import functools
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
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import outlines_core

from arbor.grammar.backends.llguidance import LlguidanceGrammar, grammar_text, make_tokenizer
from arbor.grammar.backends.outlines import CompiledGrammar
from arbor.grammar.backends.xgrammar import XgrammarGrammar, tokenizer_info_json
from arbor.grammar.bitmask import VocabTables
from arbor.grammar.budget import Distances
from arbor.grammar.constraint import (
    BACKENDS,
    Constraint,
    backend_for,
    keep_plan,
    plan,
    post_checked,
)
from arbor.grammar.vocabulary import TokenVocabulary
from arbor.grammar.worker import CompileDone, CompileJob, WorkerInit, read_frame, write_frame

# What a compile gives, by backend; each makes matchers with `.matcher()` and has `size_bytes`.
Grammar = CompiledGrammar | XgrammarGrammar | LlguidanceGrammar

logger = logging.getLogger(__name__)
WORKER_START_S = 60.0  # a compile worker's interpreter start and vocabulary load (not a job's limit)
MAX_FAILED_MESSAGE = 1000  # characters of a failed constraint's error kept for its resends


class GrammarError(ValueError):
    """A constraint that could not be compiled: invalid, too slow or too big."""


class GrammarBusy(GrammarError):
    """Too many constraints are compiling already; the request may retry shortly."""


@dataclass
class CompilerConfig:
    """Limits of the compile service (GrammarArgs: the --grammar-* flags)."""

    backend: str = "outlines"  # outlines | xgrammar | llguidance
    workers: int = 2
    timeout_s: float = 10.0
    memory_mb: int = 4096
    cache_mb: int = 512
    cache_dir: str | None = None
    max_pending: int = 64  # distinct constraints compiling or queued; more are refused (GrammarBusy)
    failed_cache: int = 1024  # failed constraints remembered (by digest), so a resend fails at once


class _Worker:
    """One compile worker process, restarted after it is killed or dies."""

    def __init__(self, init: bytes, memory_mb: int) -> None:
        self.init = init  # the WorkerInit frame
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
            raise GrammarError(_too_slow(timeout_s))
        frame = read_frame(proc.stdout)
        if frame is None:
            return self._died()
        done = self.decode(frame)
        if done.error:
            raise GrammarError(f"the constraint does not compile: {done.error}")
        return done

    def _died(self) -> CompileDone:
        code = self.proc.wait() if self.proc else None
        self.proc = None
        raise GrammarError(
            f"compiling the constraint needed more than the {self.memory_mb} MB compile memory "
            f"limit (worker exit {code}); simplify the constraint or raise --grammar-max-memory-mb"
        )

    def _start(self) -> None:
        """Start the process and wait until it has loaded the vocabulary, so that a job's time
        limit covers the compile alone, not a busy machine's interpreter start-up."""
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "arbor.grammar.worker", str(self.memory_mb)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        write_frame(self.proc.stdin, self.init)
        ready, _, _ = select.select([self.proc.stdout], [], [], WORKER_START_S)
        if not ready:
            self.kill()
            raise GrammarError(f"the grammar compile worker did not start within {WORKER_START_S:g} s")
        if read_frame(self.proc.stdout) is None:
            self._died()

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


class GrammarCompiler:
    """Compiles constraints for one vocabulary; `submit` returns a Future of a compiled grammar
    (CompiledGrammar, XgrammarGrammar or LlguidanceGrammar; each makes matchers with
    `.matcher()`), whose exception is a GrammarError with a message for the user."""

    def __init__(
        self,
        vocab: TokenVocabulary,
        config: CompilerConfig | None = None,
        encode: Callable[[str], list[int]] | None = None,
    ) -> None:
        """`encode` (text -> token ids, the Hugging Face tokenizer's) is needed by llguidance."""
        self.config = config or CompilerConfig()
        if self.config.backend not in BACKENDS:
            raise ValueError(f"grammar backend {self.config.backend!r} is unknown; use one of {', '.join(BACKENDS)}")
        if self.config.backend == "llguidance" and encode is None:
            raise ValueError("the llguidance backend needs the tokenizer's encode function")
        self.vocab = vocab
        self.encode = encode
        self.tables = VocabTables.build(vocab)
        blob = vocab.outlines().__reduce__()[1][0]
        self.vocab_digest = hashlib.sha256(blob).hexdigest()[:16]
        self._inits = {"outlines": lambda: blob, "xgrammar": lambda: self._xgrammar_info_json}
        self._workers: dict[str, queue.Queue[_Worker]] = {}
        self._xgrammar_info: Any = None
        self._llguidance_tokenizer: Any = None
        self._pool = ThreadPoolExecutor(self.config.workers, thread_name_prefix="grammar")
        self._lock = threading.Lock()
        self._cache: OrderedDict[Constraint, Any] = OrderedDict()
        self._cache_bytes = 0
        self._pending: dict[Constraint, Future] = {}
        # A digest of each failed constraint -> its error message: a few hundred bytes an entry,
        # however large the constraint (up to 200k characters) was.
        self._failed: OrderedDict[bytes, str] = OrderedDict()
        self.stats = {"compiles": 0, "cache_hits": 0, "disk_hits": 0, "errors": 0, "compile_s": 0.0}

    @functools.cached_property
    def _xgrammar_info_json(self) -> bytes:
        """xgrammar's TokenizerInfo for this vocabulary (workers and matchers load it)."""
        return tokenizer_info_json(self.vocab)

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
            failed = self._failed.get(_digest(constraint))
            if failed is not None:  # a resent bad constraint must not hold a worker again
                self._failed.move_to_end(_digest(constraint))
                return _failed_future(GrammarError(failed))
            if constraint in self._pending:
                return self._pending[constraint]
            if len(self._pending) >= self.config.max_pending:
                return _failed_future(
                    GrammarBusy(f"{len(self._pending)} constraints are compiling already (the limit); retry shortly")
                )
            future = self._pool.submit(self._compile, constraint)
            self._pending[constraint] = future
            return future

    def compile(self, constraint: Constraint) -> Any:
        """Blocking form of `submit`."""
        return self.submit(constraint).result()

    def close(self) -> None:
        """Stop the pool and kill the worker processes."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            queues = list(self._workers.values())
        for workers in queues:
            while not workers.empty():
                workers.get().kill()

    def _compile(self, constraint: Constraint) -> Any:
        try:
            start = time.perf_counter()
            backend = backend_for(self.config.backend, constraint.kind)
            builders: dict[str, Callable[[Constraint], Grammar]] = {
                "outlines": self._outlines,
                "xgrammar": self._xgrammar,
                "llguidance": self._llguidance,
            }
            build = builders[backend]
            try:
                grammar = build(constraint)
            except ValueError as exc:
                raise GrammarError(str(exc)) from None
            self.stats["compiles"] += 1
            self.stats["compile_s"] += time.perf_counter() - start
            self._remember(constraint, grammar)
            return grammar
        except GrammarError as exc:
            self.stats["errors"] += 1
            with self._lock:
                self._failed[_digest(constraint)] = str(exc)[:MAX_FAILED_MESSAGE]
                while len(self._failed) > self.config.failed_cache:
                    self._failed.popitem(last=False)
            raise
        finally:
            with self._lock:
                self._pending.pop(constraint, None)

    def _outlines(self, constraint: Constraint) -> CompiledGrammar:
        regex_plan = plan(constraint)
        # JSON is budget-aware by default: its distances are built in the worker too.
        sentinel = self.tables.sentinel if constraint.kind in ("json_schema", "json_object") else -1
        done = self._run("outlines", constraint, CompileJob(f"(?:{regex_plan.regex})\\x00", sentinel))
        keep_plan(constraint)  # the front door admitted its request: the plan is worth keeping here too
        index = outlines_core.Index.from_binary(done.index)
        distances = Distances.from_bytes(done.distances) if done.distances else None
        return CompiledGrammar(index, self.tables, regex_plan.unenforced, len(done.index), distances)

    def _xgrammar(self, constraint: Constraint) -> XgrammarGrammar:
        import xgrammar

        done = self._run(
            "xgrammar", constraint, CompileJob(_regex_of(constraint), kind=constraint.kind, text=constraint.text)
        )
        with self._lock:
            if self._xgrammar_info is None:
                self._xgrammar_info = xgrammar.TokenizerInfo.deserialize_json(self._inits["xgrammar"]().decode())
        return XgrammarGrammar(done.index, self._xgrammar_info, self.tables, post_checked(constraint, "xgrammar"))

    def _llguidance(self, constraint: Constraint) -> LlguidanceGrammar:
        """Built on a helper thread, so the time limit holds (llguidance's fuel bounds the rest)."""
        with self._lock:
            if self._llguidance_tokenizer is None:
                self._llguidance_tokenizer = make_tokenizer(self.vocab, self.encode)
        try:
            text = grammar_text(constraint.kind, constraint.text, _regex_of(constraint))
        except ValueError as exc:
            raise GrammarError(f"the constraint does not compile: {exc}") from None
        result: Future = Future()

        def build() -> None:
            try:
                result.set_result(
                    LlguidanceGrammar(
                        self._llguidance_tokenizer, text, self.tables, post_checked(constraint, "llguidance")
                    )
                )
            except Exception as exc:
                result.set_exception(exc)

        threading.Thread(target=build, name="llguidance-build", daemon=True).start()
        try:
            return result.result(timeout=self.config.timeout_s)
        except TimeoutError:
            raise GrammarError(_too_slow(self.config.timeout_s)) from None
        except ValueError as exc:
            raise GrammarError(f"the constraint does not compile: {exc}") from None

    def _run(self, backend: str, constraint: Constraint, job: CompileJob) -> CompileDone:
        """The worker's answer for `job`, or the disk cache's."""
        done = self._disk_get(backend, constraint)
        if done is not None:
            self.stats["disk_hits"] += 1
            return done
        workers = self._worker_queue(backend)
        worker = workers.get()
        try:
            done = worker.compile(job, self.config.timeout_s)
        finally:
            workers.put(worker)
        self._disk_put(backend, constraint, done)
        return done

    def _worker_queue(self, backend: str) -> queue.Queue[_Worker]:
        with self._lock:
            workers = self._workers.get(backend)
            if workers is None:
                init = msgspec.msgpack.encode(WorkerInit(backend, self._inits[backend]()))
                workers = self._workers[backend] = queue.Queue()
                for _ in range(self.config.workers):
                    workers.put(_Worker(init, self.config.memory_mb))
            return workers

    def _remember(self, constraint: Constraint, grammar: Grammar) -> None:
        limit = self.config.cache_mb << 20
        with self._lock:
            self._cache[constraint] = grammar
            self._cache_bytes += grammar.size_bytes
            while self._cache_bytes > limit and len(self._cache) > 1:
                _, old = self._cache.popitem(last=False)
                self._cache_bytes -= old.size_bytes

    def _disk_path(self, backend: str, constraint: Constraint) -> Path | None:
        if not self.config.cache_dir:
            return None
        key = f"{backend}\0{constraint.kind}\0{constraint.text}\0{self.vocab_digest}"
        key = hashlib.sha256(key.encode()).hexdigest()
        return Path(self.config.cache_dir) / f"{key}.grammar"

    def _disk_get(self, backend: str, constraint: Constraint) -> CompileDone | None:
        path = self._disk_path(backend, constraint)
        if path is None or not path.exists():
            return None
        return msgspec.msgpack.decode(path.read_bytes(), type=CompileDone)

    def _disk_put(self, backend: str, constraint: Constraint, done: CompileDone) -> None:
        path = self._disk_path(backend, constraint)
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(msgspec.msgpack.encode(done))
        tmp.replace(path)


def _regex_of(constraint: Constraint) -> str:
    """Arbor's regex for a regex or choices constraint (the pushdown backends take it as is)."""
    return plan(constraint).regex if constraint.kind in ("regex", "choices") else ""


def _too_slow(timeout_s: float) -> str:
    return (
        f"compiling the constraint took longer than {timeout_s:g} s; simplify it (fewer optional "
        "properties, smaller bounds) or raise --grammar-compile-timeout-s"
    )


def _digest(constraint: Constraint) -> bytes:
    return hashlib.sha256(f"{constraint.kind}\0{constraint.text}".encode()).digest()


def _failed_future(exc: Exception) -> Future:
    future: Future = Future()
    future.set_exception(exc)
    return future
