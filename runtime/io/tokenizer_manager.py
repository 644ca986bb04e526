"""TokenizerManager: the asyncio front door. Validates and tokenizes requests, sends them to the
scheduler, and routes the detokenizer's text outputs back to each waiting caller by rid."""

from __future__ import annotations

import asyncio
import logging
import re
import sys
import uuid

if sys.version_info >= (3, 11):
    from re import _parser as sre_parse  # the parser re uses, for match widths
else:
    import sre_parse
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import zmq.asyncio

from arbor.grammar.constraint import (
    backend_for,
    check_output,
    constraint_from_params,
    keep_plan,
    post_checked,
)
from arbor.grammar.linear_regex import ProgramBudget, compile_linear
from arbor.grammar.reasoning_gate import THINK_END, THINK_START
from arbor.runtime.config import DisaggArgs, GrammarArgs, HttpArgs
from arbor.runtime.io.generate_input import GenerateInput
from arbor.runtime.io.ipc import AsyncPuller, AsyncPusher
from arbor.runtime.io.messages import (
    AbortReq,
    BatchTextOut,
    FinishAbort,
    FinishInvalid,
    FinishStop,
    FlushCacheReq,
    OutputOptions,
    ProcessError,
    Ready,
    ReasoningMarkers,
    ShutdownReq,
    Stats,
    StatsReq,
    TextOut,
    ToFront,
    TokenizedGenerateReq,
    pack_ids,
)
from arbor.runtime.io.outputs import GenerateOutput, LogprobEntry, MetaInfo
from arbor.runtime.io.processes import ChildProcesses
from arbor.runtime.sampling.params import SamplingParams

logger = logging.getLogger(__name__)
CHILDREN = ("scheduler", "detokenizer")
WATCH_INTERVAL_S = 0.25
MAX_STOP_STRINGS = 16
MAX_TOP_LOGPROBS = 20
MAX_STOP_CHARS = 256
MAX_STOP_REGEX_WIDTH = 256  # a longer stop regex match may be partly streamed before it is found
DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's native default; OpenAI's "absent" is None (the context)
# Abort status codes answered as an HTTP error rather than a finish reason: the request was
# refused (400, 429), or its disaggregated partner or KV transfer failed (502, 503, 504).
REFUSALS = (400, 409, 429, 502, 503, 504)


class EngineDead(RuntimeError):
    """A child process died; every pending and later request fails with this."""


class RequestRefused(ValueError):
    """The engine ended a request because of the request itself (a constraint that does not
    compile, 400), a busy queue (429, retry), or a failed KV transfer between disaggregated
    workers (502, 503, 504); routes answer with `status`."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class _Sample:
    """What one output stream (one of n samples of a request) has produced so far."""

    index: int
    text: str = ""
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    input_logprobs: list[float] = field(default_factory=list)
    input_top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    last: TextOut | None = None
    streamed: int = 0  # output tokens when the last stream event was sent


@dataclass
class Prepared:
    """A validated, tokenized request ready to send. `rids` are its samples' internal ids
    (unique, never a client's); `label` is the rid the client gave (or the internal one), and
    `owner` the tenant that sent it."""

    msg: TokenizedGenerateReq
    rids: list[str]
    ids: list[int]
    return_text_in_logprobs: bool = False
    unenforced: list[str] = field(default_factory=list)  # schema keywords validated after the fact
    stream_interval: int = 1  # a stream yields every this many tokens (and at the end)
    label: str = ""
    owner: str | None = None


class TokenizerManager:
    """Owns the front socket pair; one instance per runtime, used from one event loop."""

    def __init__(
        self, http: HttpArgs, grammar: GrammarArgs, disagg: DisaggArgs, tokenizer: Any, children: ChildProcesses
    ) -> None:
        self.http = http
        self.grammar_backend = grammar.backend
        self.pd_mode = disagg.mode
        self.tokenizer = tokenizer
        self.children = children
        self.ctx = zmq.asyncio.Context()
        self.inbox = AsyncPuller(self.ctx, children.endpoints["front"], ToFront)
        self.to_scheduler = AsyncPusher(self.ctx, children.endpoints["scheduler"])
        self.info: dict[str, Any] = {}
        self.dead: str | None = None
        self._queues: dict[str, asyncio.Queue[TextOut | Exception]] = {}
        self._labels: dict[tuple[str | None, str], str] = {}  # (owner, client rid) -> internal rid
        self._stats_waiters: list[asyncio.Future[dict[str, float]]] = []
        self._tasks: list[asyncio.Task[None]] = []
        # No token spells more characters than this, so a longer text surely needs more tokens.
        self.max_token_chars = max(map(len, tokenizer.get_vocab()), default=1)

    # ------------------------------------------------------------ lifecycle

    async def start(self, timeout_s: float) -> None:
        """Wait for both children to report Ready; raise with the child's message if one fails."""
        ready: dict[str, dict[str, Any]] = {}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while len(ready) < len(CHILDREN):
            try:  # a child's own error message, if it sent one, comes before its exit code
                msg = await asyncio.wait_for(self.inbox.recv(), WATCH_INTERVAL_S)
            except asyncio.TimeoutError:
                if (problem := self.children.dead()) is not None:
                    raise EngineDead(f"{problem} during start-up; its log is above") from None
                if loop.time() > deadline:
                    raise EngineDead(
                        f"start-up took over {timeout_s:.0f} s; waiting for {set(CHILDREN) - set(ready)}"
                    ) from None
                continue
            if isinstance(msg, ProcessError):
                raise EngineDead(f"the {msg.process} process failed to start: {msg.message}")
            if isinstance(msg, Ready):
                ready[msg.process] = msg.info
        self.info = ready["scheduler"]
        self._tasks = [asyncio.create_task(self._route()), asyncio.create_task(self._watch())]

    async def shutdown(self) -> None:
        """Ask the scheduler (and through it the detokenizer) to exit; close the sockets."""
        if self.dead is None:
            await self.to_scheduler.send(ShutdownReq())
            self._fail_all(EngineDead("the engine was shut down"))
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.inbox.close()
        self.to_scheduler.close()
        self.ctx.term()

    # ------------------------------------------------------------- requests

    def prepare(self, req: GenerateInput) -> Prepared:
        """Validate and tokenize one prompt; raises ValueError naming what to change."""
        self._check_alive()
        if self.pd_mode == "decode" and req.bootstrap is None:
            raise ValueError(
                "this is a decode worker (--disaggregation-mode decode): send requests through "
                "sglang-router --pd-disaggregation, which adds bootstrap_host, bootstrap_port and "
                "bootstrap_room"
            )
        ids = self._tokenize(req)
        raw = req.sampling_params
        if raw is not None and not isinstance(raw, dict):
            raise ValueError(f"sampling_params must be an object, got {type(raw).__name__}")
        raw = dict(raw or {})
        constraint = constraint_from_params(raw, self.grammar_backend)
        output, n, interval = self._output_options(raw)
        params = self._sampling(ids, raw)
        start = _logprob_args(req, len(ids))
        rid = uuid.uuid4().hex
        rids = [rid] if n == 1 else [f"{rid}-{i}" for i in range(n)]
        label = req.rid or rid
        if (req.owner, label) in self._labels:
            raise ValueError(f"request id {label!r} is already in use; give a unique rid")
        msg = TokenizedGenerateReq(
            rid=rid,
            input_ids=pack_ids(ids),
            sampling=params,
            n=n,
            stream=req.stream,
            return_logprob=req.return_logprob,
            logprob_start_len=start,
            top_logprobs_num=req.top_logprobs_num,
            cache_salt=req.cache_salt,
            output=output,
            constraint=constraint,
            reasoning=self._reasoning_markers() if req.require_reasoning and constraint is not None else None,
            bootstrap=req.bootstrap if self.pd_mode != "null" else None,
        )
        unenforced = []
        if constraint is not None:
            unenforced = post_checked(constraint, backend_for(self.grammar_backend, constraint.kind))
        return Prepared(msg, rids, ids, req.return_text_in_logprobs, unenforced, interval, label, req.owner)

    def _reasoning_markers(self) -> ReasoningMarkers:
        """The token ids of --reasoning-parser's <think> and </think>, for require_reasoning."""
        parser = self.http.reasoning_parser
        if parser is None:
            raise ValueError(
                "require_reasoning needs a server started with --reasoning-parser (qwen3 or "
                "deepseek-r1); without one, leave it false"
            )
        ids = [self.tokenizer.encode(mark, add_special_tokens=False) for mark in (THINK_START, THINK_END)]
        return ReasoningMarkers(start_ids=ids[0], end_ids=ids[1], opens_inside=parser == "deepseek-r1")

    def prepare_batch(self, inputs: list[GenerateInput]) -> list[Prepared]:
        """`prepare` every prompt of a batch; its request ids must differ from each other."""
        prepared = [self.prepare(one) for one in inputs]
        seen: set[str] = set()
        for label in (p.label for p in prepared):
            if label in seen:
                raise ValueError(f"request id {label!r} appears twice in this batch; give each prompt its own rid")
            seen.add(label)
        return prepared

    async def generate(self, req: GenerateInput) -> AsyncIterator[GenerateOutput]:
        """`prepare` then `run`."""
        async for out in self.run(self.prepare(req)):
            yield out

    async def run(self, prepared: Prepared) -> AsyncGenerator[GenerateOutput, None]:
        """Yield outputs: with `stream`, one per text increment of each sample (cumulative
        text and ids, the output logprobs new since the last event; every `stream_interval`
        tokens; `outputs.StreamShaper` turns them into what the client asked for); else one
        final output per sample. A sample's last output has its finish reason set.
        Closing the iterator early aborts the request."""
        self._check_alive()
        msg, rids = prepared.msg, prepared.rids
        key = (prepared.owner, prepared.label)
        if key in self._labels:  # checked and registered in one step of the loop: no two owners
            raise ValueError(f"request id {prepared.label!r} is already in use; give a unique rid")
        self._labels[key] = msg.rid
        queue: asyncio.Queue[TextOut | Exception] = asyncio.Queue()
        samples = {r: _Sample(i) for i, r in enumerate(rids)}
        for r in rids:
            self._queues[r] = queue
        open_rids = set(rids)
        try:
            await self.to_scheduler.send(msg)
            while open_rids:
                item = await queue.get()
                if isinstance(item, Exception):
                    raise item
                s = samples[item.rid]
                s.text += item.text
                s.output_ids += item.output_ids
                s.logprobs += item.logprobs
                s.top_logprobs += item.top_logprobs
                s.input_logprobs += item.input_logprobs
                s.input_top_logprobs += item.input_top_logprobs
                s.last = item
                if item.finish_reason is not None:
                    open_rids.discard(item.rid)
                    reason = item.finish_reason
                    if isinstance(reason, FinishAbort) and reason.status_code in REFUSALS:
                        raise RequestRefused(reason.message, reason.status_code)
                    yield self._response(s, prepared)
                elif msg.stream and len(s.output_ids) - s.streamed >= prepared.stream_interval:
                    yield self._response(s, prepared)
            keep_plan(msg.constraint)  # it ran: a refused request's plan never enters the kept cache
        finally:
            for r in rids:
                self._queues.pop(r, None)
            self._labels.pop(key, None)
            if open_rids and self.dead is None:  # the caller went away: stop the work now
                for r in sorted(open_rids):
                    await self.to_scheduler.send(AbortReq(rid=r))

    async def abort(self, rid: str, owner: str | None = None, any_owner: bool = False) -> bool:
        """Abort the running request that `owner` labelled `rid` (`any_owner`: whoever sent it);
        whether one was found. Other tenants' requests are out of reach."""
        self._check_alive()
        found = [
            internal for (who, label), internal in self._labels.items() if label == rid and (any_owner or who == owner)
        ]
        for internal in found:
            await self.to_scheduler.send(AbortReq(rid=internal))
        return bool(found)

    async def stats(self) -> dict[str, float]:
        """The scheduler's counters (answered after every message sent before this call)."""
        self._check_alive()
        fut: asyncio.Future[dict[str, float]] = asyncio.get_running_loop().create_future()
        self._stats_waiters.append(fut)
        await self.to_scheduler.send(StatsReq())
        return await fut

    async def flush_cache(self) -> dict[str, float]:
        """Drop every unlocked cached prefix; returns the counters after the flush."""
        self._check_alive()
        await self.to_scheduler.send(FlushCacheReq())
        return await self.stats()

    # ------------------------------------------------------------ validation

    def _tokenize(self, req: GenerateInput) -> list[int]:
        if (req.text is None) == (req.input_ids is None):
            raise ValueError("give exactly one of text (a prompt string) or input_ids (token ids)")
        if req.text is not None:
            if not isinstance(req.text, str):
                raise ValueError(f"text must be a string, got {type(req.text).__name__}")
            most = self.info["context_length"] * self.max_token_chars
            if len(req.text) > most:  # surely over the context: refuse before tokenizing
                raise ValueError(
                    f"text has {len(req.text)} characters, more than {most}, which cannot fit the "
                    f"context length of {self.info['context_length']} tokens; shorten the prompt"
                )
            ids = self.tokenizer.encode(req.text)
        else:
            ids = req.input_ids
            if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
                raise ValueError("input_ids must be a list of integer token ids")
        if not ids:
            raise ValueError("the prompt is empty; give at least one token")
        vocab = self.info["vocab_size"]
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {vocab})")
        context = self.info["context_length"]
        if len(ids) >= context:
            raise ValueError(
                f"prompt has {len(ids)} tokens but the context length is {context}; "
                "shorten the prompt (at least one token must be generated)"
            )
        return ids

    def _output_options(self, raw: dict[str, Any]) -> tuple[OutputOptions, int, int]:
        """Take the output keys out of a sampling-params dict: (options, n, stream_interval)."""
        flags = {}
        for name, default in (
            ("no_stop_trim", False),
            ("skip_special_tokens", True),
            ("spaces_between_special_tokens", True),
        ):
            value = raw.pop(name, None)
            if value is not None and not isinstance(value, bool):
                raise ValueError(f"{name} must be true or false, got {value!r}")
            flags[name] = default if value is None else value
        patterns = _stop_regexes(raw.pop("stop_regex", None))
        output = OutputOptions(
            stop=_stop_strings(raw.pop("stop", None), "stop"),
            stop_regex=patterns,
            stop_regex_max_len=max(map(_match_width, patterns), default=0),
            **flags,
        )
        n = _bounded_int(raw.pop("n", None), "n", 1, 1, self.http.max_n)
        interval = _bounded_int(raw.pop("stream_interval", None), "stream_interval", 1, 1, 1 << 20)
        return output, n, interval

    def _sampling(self, ids: list[int], raw: dict[str, Any]) -> SamplingParams:
        """SamplingParams with max_new_tokens settled once: absent = 128 (SGLang's default),
        None = until the context (or the KV pool) is full; never past the context."""
        asked = raw.pop("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
        params = SamplingParams.from_dict(raw)
        params.fit_vocab(self.info["vocab_size"])
        context, total = self.info["context_length"], self.info["max_total_tokens"]
        room = min(context, total) - len(ids)
        if asked is None:
            params.max_new_tokens = room
            return params
        if not isinstance(asked, int) or isinstance(asked, bool) or asked < 0:
            raise ValueError(f"max_new_tokens must be an integer >= 0, got {asked!r}")
        if asked > context:
            raise ValueError(
                f"max_new_tokens is {asked} but the context length is {context}; "
                f"ask for at most {context}, or leave it out to run until the context is full"
            )
        params.max_new_tokens = min(asked, context - len(ids))  # ends with "length" at the context limit
        need = len(ids) + params.max_new_tokens
        if need > total:
            raise ValueError(
                f"request needs {need} KV slots (prompt + max_new_tokens) but the cache holds "
                f"{total}; lower max_new_tokens or raise max_total_tokens"
            )
        return params

    def _check_alive(self) -> None:
        if self.dead is not None:
            raise EngineDead(self.dead)

    # ----------------------------------------------------------- background

    async def _route(self) -> None:
        """Deliver every message from the detokenizer to whoever waits for it."""
        while True:
            msg = await self.inbox.recv()
            if isinstance(msg, BatchTextOut):
                for out in msg.outs:
                    queue = self._queues.get(out.rid)
                    if queue is not None:
                        queue.put_nowait(out)
            elif isinstance(msg, Stats):
                if self._stats_waiters:
                    fut = self._stats_waiters.pop(0)
                    if not fut.done():
                        fut.set_result(msg.values)
            elif isinstance(msg, ProcessError):
                self._die(f"the {msg.process} process failed: {msg.message}")

    async def _watch(self) -> None:
        """Fail everything at once if a child process dies."""
        while self.dead is None:
            await asyncio.sleep(WATCH_INTERVAL_S)
            if (problem := self.children.dead()) is not None:
                self._die(problem)

    def _die(self, message: str) -> None:
        if self.dead is None:
            logger.error("%s; the engine has stopped", message)
            self.dead = f"{message}; the engine has stopped"
            self._fail_all(EngineDead(self.dead))
            # Stop (and reap) the surviving child off the loop; shutdown() only waits for it.
            asyncio.get_running_loop().run_in_executor(None, self.children.stop)

    def _fail_all(self, exc: Exception) -> None:
        for queue in set(self._queues.values()):
            queue.put_nowait(exc)
        for fut in self._stats_waiters:
            if not fut.done():
                fut.set_exception(exc)
        self._stats_waiters.clear()

    def _response(self, s: _Sample, prepared: Prepared) -> GenerateOutput:
        last = s.last
        assert last is not None
        msg = prepared.msg
        label = prepared.label if msg.n == 1 else f"{prepared.label}-{s.index}"
        meta = MetaInfo(
            id=label,
            finish_reason=last.finish_reason,
            prompt_tokens=last.prompt_tokens,
            completion_tokens=len(s.output_ids),
            cached_tokens=last.cached_tokens,
        )
        if last.spec_verify_ct:
            meta.spec_verify_ct = last.spec_verify_ct
            meta.spec_accept_len = round(len(s.output_ids) / last.spec_verify_ct, 3)
        if msg.return_logprob:
            entry = self._logprob_entry if prepared.return_text_in_logprobs else _bare_entry
            start = s.streamed  # a stream event carries only its new logprobs (StreamShaper adds up)
            meta.output_token_logprobs = [entry(lp, t) for lp, t in zip(s.logprobs[start:], s.output_ids[start:])]
            meta.output_token_logprobs_length = len(s.logprobs)
            if msg.top_logprobs_num:
                meta.output_top_logprobs = [[entry(lp, t) for lp, t in row] for row in s.top_logprobs[start:]]
            # Disaggregated, the prefill worker's answer has the prompt's (the router merges them).
            elsewhere = msg.bootstrap is not None and self.pd_mode == "decode"
            if last.finish_reason is not None and (msg.logprob_start_len < 0 or elsewhere):
                meta.input_token_logprobs = []  # SGLang's shape: present, empty when not asked for
            elif last.finish_reason is not None:
                first = msg.logprob_start_len
                head = [entry(None, prepared.ids[0])] if first == 0 else []
                targets = prepared.ids[max(first, 1) :]
                meta.input_token_logprobs = head + [entry(lp, t) for lp, t in zip(s.input_logprobs, targets)]
                if msg.top_logprobs_num:
                    rows = [[entry(lp, t) for lp, t in row] for row in s.input_top_logprobs]
                    meta.input_top_logprobs = ([None] if first == 0 else []) + rows
        s.streamed = len(s.output_ids)
        if prepared.unenforced and last.finish_reason is not None:
            meta.schema_check = check = check_output(prepared.msg.constraint, s.text, prepared.unenforced)
            if not check["valid"] and isinstance(last.finish_reason, FinishStop):
                meta.finish_reason = FinishInvalid(
                    message=f"the output does not satisfy the schema (checked after generation): {check['error']}"
                )
        return GenerateOutput(
            text=s.text, output_ids=list(s.output_ids), meta_info=meta, index=s.index if msg.n > 1 else None
        )

    def _logprob_entry(self, lp: float | None, token: int) -> LogprobEntry:
        return LogprobEntry(lp, token, self.tokenizer.decode([token]))


def _bare_entry(lp: float | None, token: int) -> LogprobEntry:
    return LogprobEntry(lp, token, None)


def _logprob_args(req: GenerateInput, prompt_len: int) -> int:
    """Check the logprob options; the prompt position prompt logprobs start at (-1 = none)."""
    k = req.top_logprobs_num
    if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= MAX_TOP_LOGPROBS:
        raise ValueError(f"top_logprobs_num must be an integer in [0, {MAX_TOP_LOGPROBS}], got {k!r}")
    start = req.logprob_start_len
    if not isinstance(start, int) or isinstance(start, bool) or start < -1:
        raise ValueError(f"logprob_start_len must be an integer >= -1 (-1 = no prompt logprobs), got {start!r}")
    if start >= prompt_len:
        raise ValueError(f"logprob_start_len {start} is past the prompt's last position ({prompt_len - 1})")
    return start if req.return_logprob else -1


def _stop_strings(stop: Any, name: str) -> list[str]:
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(x, str) and x for x in stops):
        raise ValueError(f"{name} must be a non-empty string or a list of non-empty strings")
    if len(stops) > MAX_STOP_STRINGS or any(len(x) > MAX_STOP_CHARS for x in stops):
        raise ValueError(f"{name} allows at most {MAX_STOP_STRINGS} strings of at most {MAX_STOP_CHARS} characters")
    return stops


def _stop_regexes(stop_regex: Any) -> list[str]:
    """The stop regexes, each one RE2 runs (the detokenizer searches with RE2, in linear time)."""
    patterns = _stop_strings(stop_regex, "stop_regex")
    budget = ProgramBudget()
    for p in set(patterns):
        budget.take(compile_linear(p, "stop_regex"), "stop_regex")
    return patterns


def _match_width(pattern: str) -> int:
    """The longest text `pattern` can match, capped at MAX_STOP_REGEX_WIDTH (unbounded repeats,
    or RE2 syntax Python's parser does not know)."""
    try:
        return min(sre_parse.parse(pattern).getwidth()[1], MAX_STOP_REGEX_WIDTH)
    except (re.error, RecursionError, OverflowError):
        return MAX_STOP_REGEX_WIDTH


def _bounded_int(value: Any, name: str, default: int, low: int, high: int) -> int:
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ValueError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
    return value
