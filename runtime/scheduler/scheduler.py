"""Scheduler: continuous batching over the radix cache. One `step()` = plan, run, process.

Each step, `Admission` plans what runs (a `StepPlan`): prompt chunks of the waiting requests
that the policy and the KV budget admit, in one forward with a decode step of every running
request (mixed chunks, on by default; `--disable-mixed-chunk` gives prompts steps of their own
and puts a decode step between two chunks of a long prompt), or a decode step alone. With
speculation on, a decode step first tries `SpecDecoder` (guesses verified in one forward). On
a disaggregated worker (`--disaggregation-mode`) the `Role` moves KV: a prefill worker ends a
request at its first token and sends its KV, a decode worker receives it and decodes. The
process loop around the step lives in `runtime/scheduler/process.py`.
"""

from __future__ import annotations

import dataclasses
import logging

import msgspec
import torch
import zmq

from arbor.grammar.compiler import GrammarBusy
from arbor.runtime.config import ServerArgs
from arbor.runtime.disaggregation.role import make_role
from arbor.runtime.io.messages import (
    FinishAbort,
    FinishLength,
    FinishReason,
    FinishStop,
    ReqOut,
    TokenizedGenerateReq,
    pack_ids,
    unpack_ids,
)
from arbor.runtime.kv.manager import KVManager, make_prefix_cache
from arbor.runtime.model.forward_batch import ForwardBatch
from arbor.runtime.model.parallel import SINGLE, TensorParallel
from arbor.runtime.model.runner import ModelRunner
from arbor.runtime.sampling.logits import prepare_logits, prompt_logprobs, token_logprobs
from arbor.runtime.sampling.sampler import Sampler
from arbor.runtime.scheduler.admission import Admission
from arbor.runtime.scheduler.batch import build_batch
from arbor.runtime.scheduler.grammar_manager import GrammarManager
from arbor.runtime.scheduler.req import Req, ReqStatus
from arbor.runtime.scheduler.stats import SchedulerStats
from arbor.runtime.scheduler.step_plan import OnNoKV, StepMode, StepPlan, decode_plan
from arbor.runtime.scheduler.tensor_parallel import TpLeader
from arbor.runtime.spec.decoder import SpecDecoder, TokenLogprobs
from arbor.runtime.spec.proposer import make_proposer

logger = logging.getLogger(__name__)

HOLDS_KV = (ReqStatus.PREFILLING, ReqStatus.RUNNING)  # statuses whose KV the scheduler frees


class Scheduler:
    """Owns the ModelRunner, the KV bookkeeping and the request queues (by status: `compiling`,
    `waiting`, `running`; the prompt being chunked is the admission's). Executes the plans
    `Admission` makes, with `SpecDecoder` for speculative decode steps and a `Role` for
    disaggregation."""

    def __init__(
        self,
        args: ServerArgs,
        model_path: str,
        tokenizer_path: str | None = None,
        tp: TensorParallel = SINGLE,
        leader: TpLeader | None = None,
    ) -> None:
        """Each part gets its own sections of `args`. Under tensor parallelism this is rank 0:
        `leader` sends each forward to the other ranks."""
        self.config = args.scheduler
        self.grammar_config = args.grammar
        self.tokenizer_path = tokenizer_path or model_path
        self.runner = ModelRunner(args.model, args.cache, args.scheduler.max_running_requests, model_path, tp=tp)
        if leader is not None:
            leader.setup(self.runner.kv_pool.num_slots)
            self.runner.leader = leader
        self.kv = KVManager(self.runner.allocator, self.runner.req_to_token, make_prefix_cache(args.cache))
        self.sampler = Sampler(args.scheduler.random_seed, self.runner.device)
        self.eos_ids = list(self.runner.config.eos_token_ids)
        self.stats = SchedulerStats()
        self.admission = Admission(args.scheduler, self.kv, self.runner.context_len, self.stats)
        self.waiting: list[Req] = []
        self.grammar: GrammarManager | None = None  # started by the first constrained request
        self.compiling: list[Req] = []  # constrained requests whose grammar is not ready yet
        self.running: list[Req] = []  # decoding
        self._arrivals = 0
        proposer = make_proposer(args.spec, args.model, args.cache, self.runner)
        self.spec = (
            None
            if proposer is None
            else SpecDecoder(
                proposer, self.runner, self.kv, self.sampler, self.eos_ids, args.spec.max_batch, self.stats, self
            )
        )
        # Disaggregated: its side (a prefill worker serves KV pulls on --host).
        self.pd = make_role(args.disagg, args.http.host, self.kv, self.runner.kv_pool, self.stats)

    # -------------------------------------------------------------- intake

    def add(self, msg: TokenizedGenerateReq) -> list[ReqOut]:
        """Queue a request (n > 1: n requests). The front door validated it: the prompt fits
        the context and prompt + max_new_tokens fits the KV pool."""
        ids = unpack_ids(msg.input_ids)
        params = msg.sampling
        rids = [msg.rid] if msg.n == 1 else [f"{msg.rid}-{i}" for i in range(msg.n)]
        future = self._grammar().submit(msg.constraint) if msg.constraint is not None else None
        for i, rid in enumerate(rids):
            self._arrivals += 1
            # Seeded n > 1: sample i draws from seed + i, so the samples differ yet reproduce.
            own = params if params.seed is None or i == 0 else dataclasses.replace(params, seed=params.seed + i)
            # Disaggregated n > 1: sample i's KV travels in room + i, on both workers.
            boot = msg.bootstrap
            if boot is not None and i:
                boot = msgspec.structs.replace(boot, room=(boot.room + i) % 2**64)
            req = Req(
                rid,
                ids,
                own,
                group=msg.rid,
                stream=msg.stream,
                return_logprob=msg.return_logprob,
                logprob_start=msg.logprob_start_len if msg.return_logprob else -1,
                top_logprobs_num=msg.top_logprobs_num if msg.return_logprob else 0,
                cache_salt=msg.cache_salt,
                output=msg.output,
                arrival=self._arrivals,
                constraint=msg.constraint,
                grammar_future=future,
                bootstrap=boot,
                reasoning=msg.reasoning,
            )
            if future is not None:
                req.status = ReqStatus.COMPILING
                self.compiling.append(req)
            else:
                self._enqueue(req)
        return []

    def _enqueue(self, req: Req) -> None:
        """Queue a request to prefill here, or (decode worker) to receive its prompt's KV."""
        if self.pd.takes(req):
            req.status = ReqStatus.TRANSFERRING
        else:
            req.status = ReqStatus.WAITING
            self.waiting.append(req)

    def _grammar(self) -> GrammarManager:
        if self.grammar is None:
            self.grammar = GrammarManager(
                self.grammar_config, self.tokenizer_path, self.eos_ids, self.runner.config.vocab_size
            )
        return self.grammar

    def _grammars_ready(self) -> list[ReqOut]:
        """Move requests whose grammar compiled to the waiting queue; end those that failed."""
        outs, still = [], []
        for req in self.compiling:
            future = req.grammar_future
            if not future.done():
                still.append(req)
                continue
            req.grammar_future = None
            if future.exception() is not None:
                exc = future.exception()
                req.finish_reason = FinishAbort(
                    message=str(exc), status_code=429 if isinstance(exc, GrammarBusy) else 400
                )
                outs.append(self._ended(req))
                continue
            assert self.grammar is not None
            self.grammar.start(req, future.result())
            self.stats.forced_tokens += len(req.output_ids)
            matcher = req.matcher
            assert matcher is not None  # `start` gave it one
            least = matcher.distance() if matcher.budget_aware else 0
            if least > req.remaining_new_tokens:
                req.finish_reason = FinishAbort(
                    status_code=400,
                    message=(
                        f"max_new_tokens {req.params.max_new_tokens} is below the {len(req.output_ids) + least} tokens "
                        f"this constraint needs at the least; raise it (max_tokens) to {len(req.output_ids) + least} "
                        "or more, or send budget_aware=false"
                    ),
                )
            elif matcher.is_terminated():
                req.finish_reason = FinishStop()
            elif req.remaining_new_tokens == 0:
                req.finish_reason = FinishLength(length=len(req.output_ids))
            if req.finish_reason is not None:
                outs.append(self._ended(req))
            else:
                self._enqueue(req)
        self.compiling = still
        return outs

    def close(self) -> None:
        """Stop the grammar compile workers and the KV transfer sockets."""
        if self.grammar is not None:
            self.grammar.close()
        self.pd.close()

    def abort(self, rid: str) -> list[ReqOut]:
        """End the request with exactly this rid (or, for n > 1, its samples) and free its KV now."""
        outs = []
        chunked = self.admission.chunked
        for req in [r for r in self.compiling + self.waiting + self.running + [chunked] if r is not None]:
            if rid in (req.rid, req.group):
                req.finish_reason = FinishAbort(message="aborted", status_code=499)
                outs.append(self._finish(req))
        outs += [self._ended(r) for r in self.pd.abort(rid)]
        return outs

    def flush_cache(self) -> None:
        """Drop every cached prefix no running request holds; with nothing running, the pool
        starts over in order (fresh prompts get consecutive pages again)."""
        self.kv.make_room(self.kv.available())
        if not self.has_work and self.runner.allocator.available() == self.runner.allocator.total_slots:
            self.runner.allocator.reset()

    @property
    def has_work(self) -> bool:
        return bool(self.busy or self.compiling or self.transferring)

    @property
    def awaiting_kv(self) -> int:
        """Decode worker: requests queued for slots or waiting for their KV (load the router reads)."""
        return self.pd.awaiting

    def wake_sockets(self) -> list[zmq.Socket[bytes]]:
        """Sockets besides the inbox whose messages need a step (a prefill worker's bootstrap port)."""
        return self.pd.sockets

    @property
    def transferring(self) -> bool:
        """Whether disaggregated requests wait for a KV transfer (sent or received)."""
        return self.pd.busy

    @property
    def busy(self) -> bool:
        """Whether a step would run a forward pass."""
        return bool(self.waiting or self.running or self.admission.chunked)

    # ---------------------------------------------------------------- step

    @torch.inference_mode()
    def step(self) -> list[ReqOut]:
        """Take in compiled grammars and KV transfers, then plan one step and run it (one
        forward pass), returning what it produced. If building or running the batch raises,
        only that plan's requests end (with the error); the scheduler goes on with every
        other request."""
        outs = self._grammars_ready() if self.compiling else []
        if self.transferring:
            outs += self._transfers()
        plan = self.admission.plan(self.waiting, self.running)
        if plan.num_prefill:
            self.waiting = [r for r in self.waiting if r.status is ReqStatus.WAITING]
        sent = [r.sent_ids for r in plan.reqs]
        try:
            return outs + self._run(plan)
        except Exception as exc:
            logger.exception("a batch of %d request(s) failed; ending them and going on", len(plan.reqs))
            return outs + self._fail(plan.reqs, sent, exc)

    def _run(self, plan: StepPlan) -> list[ReqOut]:
        """Execute a plan: reserve its KV and build its batch (when the KV does not fit, do
        what the plan says), forward, then sample and advance every row."""
        if plan.mode is StepMode.IDLE:
            return []
        if plan.mode is StepMode.DECODE and self.spec is not None:
            outs = self.spec.step(self.running, self.grammar)
            if outs is not None:
                self.running = [r for r in self.running if r.finish_reason is None]
                return outs
        batch = self._build(plan)
        while batch is None:
            if plan.on_no_kv is OnNoKV.REQUEUE:
                return self._requeue_prefill(plan)
            self._retract_one()
            if not self.running:
                return []
            plan = decode_plan(self.running)
            batch = self._build(plan)
        n = plan.num_prefill
        if n:
            self.admission.reserved()
        out = self.runner.forward(batch)
        logits = out.next_token_logits
        outs = self._finish_decode(plan, logits[n:] if n else logits) if plan.decode else []
        if n:
            if out.all_logits is not None:
                prompt_logprobs(
                    list(plan.prefill), [r.fill_ids() for r in plan.prefill], list(plan.prefill_ends), out.all_logits
                )
            outs += self._finish_prefill(plan, logits[:n])
        return outs

    def _build(self, plan: StepPlan) -> ForwardBatch | None:
        return build_batch(self.kv, plan.forward_mode, plan.reqs, plan.ends, plan.inputs, plan.all_logits)

    def _fail(self, reqs: tuple[Req, ...], sent: list[int], exc: Exception) -> list[ReqOut]:
        """End the requests of a failed step. Their KV is released as far as it was computed
        (kv_len advances only after a forward succeeds); outputs the step built are lost, so
        each request's final output is built again from what was sent before it."""
        self.stats.failed_batches += 1
        outs = []
        for req, before in zip(reqs, sent):
            req.sent_ids = before
            if req.finish_reason is None:
                req.finish_reason = FinishAbort(
                    message=f"the batch this request was in failed: {type(exc).__name__}: {exc}", status_code=500
                )
                outs.append(self._finish(req))
            else:
                outs.append(self._out(req))
        problem = self.check_invariant()
        if problem:
            logger.error("INVARIANT VIOLATED after a failed batch: %s", problem)
        return outs

    def _transfers(self) -> list[ReqOut]:
        """Disaggregation: move KV transfers on; a decode worker starts the requests whose KV
        came in from the prefill worker's first token (and its logprobs)."""
        ended, arrived = self.pd.step(self.config.max_running_requests - len(self.running))
        outs = [self._ended(r) for r in ended]
        for req, done in arrived:
            req.status = ReqStatus.RUNNING  # its KV is in this worker's pool now
            self.commit(req, done.token, ([done.logprob], [done.top_logprobs]) if done.logprob is not None else None, 0)
            self.stats.generated_tokens += 1
            self.emit(req, outs)
            if req.finish_reason is None:
                self.running.append(req)
        return outs

    def _requeue_prefill(self, plan: StepPlan) -> list[ReqOut]:
        """The plan's prompts could not reserve their KV (memory estimates were off): put them
        back and decode instead."""
        reqs = plan.prefill
        if len(reqs) == 1 and not self.running:
            return [self._refuse_unfittable(reqs[0])]
        for req in reversed(reqs):
            self._requeue(req, retract=False)
        self.admission.requeued()
        return self._run(decode_plan(self.running)) if self.running else []

    def _finish_prefill(self, plan: StepPlan, logits: torch.Tensor) -> list[ReqOut]:
        """Advance the prefilled requests; those whose prompt is done sample their first token."""
        self.stats.prefill_steps += 1
        self.admission.prefilled(plan)
        done_rows, done, outs = [], [], []
        for i, (req, end) in enumerate(zip(plan.prefill, plan.prefill_ends)):
            req.kv_len = end
            self.kv.cache_prefix(req)  # later requests (and the n samples) reuse the prompt
            if end < req.seq_len:
                continue  # the admission chunks the rest next step
            if req.params.max_new_tokens == 0:  # prefill only: cache the prompt, maybe logprobs
                req.finish_reason = FinishLength(length=0)
                outs.append(self._finish(req))
                continue
            done_rows.append(i)
            done.append(req)
        if done:
            outs += self._sample_and_finish(done, logits[done_rows])
        for req in done:
            if req.finish_reason is None:
                req.status = ReqStatus.RUNNING
                self.running.append(req)
        return outs

    def _finish_decode(self, plan: StepPlan, logits: torch.Tensor) -> list[ReqOut]:
        reqs = list(plan.decode)
        for r, e in zip(reqs, plan.decode_ends):
            r.kv_len = e
        self.count_decode_step()
        outs = self._sample_and_finish(reqs, logits)
        self.running = [r for r in self.running if r.finish_reason is None]
        return outs

    def count_decode_step(self) -> None:
        """Count a decode step of the running batch (plain or speculative)."""
        self.stats.decode_steps += 1
        self.admission.decoded()

    # ------------------------------------------------------------ results

    def _sample_and_finish(self, reqs: list[Req], logits: torch.Tensor) -> list[ReqOut]:
        logits, sampling = prepare_logits(reqs, logits, self.eos_ids, self.grammar)
        tokens = self.sampler(logits, sampling).tolist()
        lps = token_logprobs(reqs, logits, list(range(len(reqs))), tokens)
        outs: list[ReqOut] = []
        for i, (req, tok) in enumerate(zip(reqs, tokens)):
            self.commit(req, tok, lps, i)
            self.emit(req, outs)
        self.stats.generated_tokens += len(reqs)
        return outs

    def commit(self, req: Req, tok: int, lps: TokenLogprobs | None, i: int) -> bool:
        """Append a chosen token (with its logprob, entry i of `token_logprobs`'s answer), set
        the finish reason if it ends the request, and step the grammar. True if a jump-forward
        rewrote the output."""
        req.output_ids.append(tok)
        if lps is not None and req.return_logprob:
            req.logprobs.append(lps[0][i])
            if req.top_logprobs_num:
                req.top_logprobs.append(lps[1][i][: req.top_logprobs_num])
        req.finish_reason = self._finish_reason(req, tok)
        if req.matcher is None or req.finish_reason is not None:
            return False
        length = len(req.output_ids)
        req.finish_reason = self._grammar_step(req, tok)
        return len(req.output_ids) != length or req.output_ids[-1] != tok

    def emit(self, req: Req, outs: list[ReqOut]) -> None:
        """After a step: the request's final output, or its progress if someone reads it. A
        prefill worker's disaggregated request ends at its first token and waits for its
        KV to reach the decode worker."""
        if self.pd.keeps(req):
            req.status = ReqStatus.TRANSFERRING
            return
        if req.finish_reason is not None:
            outs.append(self._finish(req))
        elif req.stream or req.output.scans_text:
            outs.append(self._out(req))

    def _finish_reason(self, req: Req, tok: int) -> FinishReason | None:
        p = req.params
        # EOS is in a constrained request's mask only where its grammar may end: there it ends,
        # ignore_eos or not (the grammar has nothing to add).
        if len(req.output_ids) >= p.min_new_tokens and (
            tok in p.stop_token_ids or (tok in self.eos_ids and (not p.ignore_eos or req.matcher is not None))
        ):
            return FinishStop(matched=tok)
        if len(req.output_ids) >= p.max_new_tokens:
            return FinishLength(length=len(req.output_ids))
        return None

    def _grammar_step(self, req: Req, tok: int) -> FinishReason | None:
        """Advance the request's grammar (maybe jumping forward); a finish reason if it ends."""
        assert self.grammar is not None and req.matcher is not None
        before = len(req.output_ids)
        abort = self.grammar.advance(req, tok)
        if abort is not None:
            return abort
        self.stats.forced_tokens += len(req.output_ids) - before
        if req.matcher.is_terminated():
            return FinishStop()
        if len(req.output_ids) >= req.params.max_new_tokens:
            return FinishLength(length=len(req.output_ids))
        return None

    def _finish(self, req: Req) -> ReqOut:
        """End a request the scheduler holds (its finish reason set): free its KV, take it
        off the queue its status names, and build its final output."""
        status = req.status
        if status in HOLDS_KV:
            self._release(req)
        if isinstance(req.finish_reason, FinishAbort):
            self.pd.ended(req)
        if status is ReqStatus.WAITING:
            self.waiting = [r for r in self.waiting if r is not req]
        elif status is ReqStatus.RUNNING:
            self.running = [r for r in self.running if r is not req]
        elif status is ReqStatus.COMPILING:
            self.compiling = [r for r in self.compiling if r is not req]
        elif status is ReqStatus.PREFILLING:
            self.admission.forget(req)
        return self._ended(req)

    def _ended(self, req: Req) -> ReqOut:
        """The final output of a request that holds no KV in the scheduler's name (any more)."""
        req.status = ReqStatus.FINISHED
        return self._out(req)

    def _release(self, req: Req) -> None:
        """Free the request's KV (caching what it computed), and its draft's."""
        self.kv.release(req)
        if self.spec is not None:
            self.spec.release(req)

    def _out(self, req: Req) -> ReqOut:
        new = req.output_ids[req.sent_ids :]
        logprobs = req.logprobs[req.sent_ids :]
        top = req.top_logprobs[req.sent_ids :]
        first = req.sent_ids == 0
        req.sent_ids = len(req.output_ids)
        return ReqOut(
            rid=req.rid,
            new_ids=pack_ids(new),
            finish_reason=req.finish_reason,
            prompt_tokens=len(req.origin_ids),
            completion_tokens=len(req.output_ids),
            cached_tokens=req.cached_tokens,
            spec_verify_ct=req.spec_verify_ct,
            logprobs=logprobs,
            top_logprobs=top,
            input_logprobs=req.input_logprobs if first else [],
            input_top_logprobs=req.input_top_logprobs if first else [],
            output=req.output,
        )

    # ---------------------------------------------------------- KV pressure

    def _retract_one(self) -> None:
        """Send the running request with the least progress back to the queue (it recomputes)."""
        victim = min(self.running, key=lambda r: (len(r.output_ids), -len(r.origin_ids)))
        if len(self.running) == 1 and not self.kv.make_room(1):
            logger.error("one request alone does not fit the KV cache: %s", victim.rid)
        self._requeue(victim, retract=True)
        self.stats.retractions += 1
        self.admission.retracted()

    def _requeue(self, req: Req, retract: bool) -> None:
        """Send a prefilling or running request back to the head of the queue, its KV freed
        (what it computed stays cached). A retracted one recomputes its output later; a
        prefill that did not run keeps its place and recomputes nothing."""
        if req.status is ReqStatus.RUNNING:
            self.running.remove(req)
        if req.status in HOLDS_KV:
            self._release(req)
        req.retractions += retract
        if req.wants_prompt_logprobs:
            req.input_logprobs, req.input_top_logprobs = [], []  # a restarted prompt computes them again
        req.status = ReqStatus.WAITING
        self.waiting.insert(0, req)

    def _refuse_unfittable(self, req: Req) -> ReqOut:
        """End a request that cannot get its KV even with nothing else running."""
        req.finish_reason = FinishAbort(
            message=f"the request needs more KV slots than the pool can free ({self.kv.available()}); shorten it",
            status_code=400,
        )
        return self._finish(req)

    # ----------------------------------------------------------- integrity

    def check_invariant(self) -> str | None:
        """None when every KV slot is accounted for, else the numbers."""
        return self.kv.check()
