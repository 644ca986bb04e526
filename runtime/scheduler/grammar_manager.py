"""The scheduler's side of constrained decoding: compile service, masks, jump-forward.

The tokenizer, vocabulary and compiler are built on a background thread when the first
constrained request arrives, so unconstrained serving pays nothing and the loop never waits.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

from arbor.grammar.compiler import CompilerConfig, GrammarCompiler
from arbor.grammar.constraint import Constraint
from arbor.grammar.jump_forward import Retokenizer
from arbor.grammar.matcher import CompiledConstraint
from arbor.grammar.reasoning_gate import ReasoningGate
from arbor.grammar.vocabulary import TokenVocabulary
from arbor.kernels.reference import apply_token_bitmask_ref
from arbor.runtime.config import GrammarArgs
from arbor.runtime.io.messages import FinishAbort
from arbor.runtime.io.tokenizer import load_tokenizer
from arbor.runtime.scheduler.req import Req

logger = logging.getLogger(__name__)


class GrammarManager:
    """Compiles constraints asynchronously and steps each constrained request's matcher."""

    def __init__(self, grammar: GrammarArgs, tokenizer_path: str, eos_ids: list[int], logits_size: int) -> None:
        self.jump_forward = not grammar.disable_jump_forward
        self.max_mask_s = grammar.max_mask_ms / 1e3
        self.config = CompilerConfig(
            backend=grammar.backend,
            workers=grammar.workers,
            timeout_s=grammar.compile_timeout_s,
            memory_mb=grammar.max_memory_mb,
            cache_mb=grammar.cache_mb,
            cache_dir=grammar.cache_dir,
            max_pending=grammar.max_pending,
        )
        self._setup_pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-setup")
        self._setup: Future[None] = self._setup_pool.submit(self._build, tokenizer_path, eos_ids, logits_size)
        self.compiler: GrammarCompiler | None = None
        self.retokenizer: Retokenizer | None = None

    def _build(self, tokenizer_path: str, eos_ids: list[int], logits_size: int) -> None:
        tokenizer = load_tokenizer(tokenizer_path)
        vocab = TokenVocabulary.from_tokenizer(tokenizer, eos_ids, logits_size)
        self.retokenizer = Retokenizer(tokenizer, vocab)
        self.compiler = GrammarCompiler(
            vocab, self.config, encode=lambda text: tokenizer.encode(text, add_special_tokens=False)
        )

    def submit(self, constraint: Constraint) -> Future[CompiledConstraint]:
        """A Future of the compiled grammar (exception: a message for the user)."""
        out: Future[CompiledConstraint] = Future()

        def start(setup: Future[None]) -> None:
            if setup.exception() is not None:
                out.set_exception(setup.exception())
                return
            assert self.compiler is not None
            self.compiler.submit(constraint).add_done_callback(lambda f: _copy_result(f, out))

        self._setup.add_done_callback(start)
        return out

    def close(self) -> None:
        self._setup_pool.shutdown(wait=False)
        if self.compiler is not None:
            self.compiler.close()

    # ------------------------------------------------------------ per step

    def start(self, req: Req, grammar: CompiledConstraint) -> None:
        """Give a request its matcher and write the opening forced text as output tokens."""
        budget = req.params.budget_aware
        if budget is None:  # on by default where the output is JSON
            budget = req.constraint is not None and req.constraint.kind in ("json_schema", "json_object")
        req.matcher = grammar.matcher(budget)
        if req.reasoning is not None:
            marks = req.reasoning
            req.matcher = ReasoningGate(req.matcher, marks.start_ids, marks.end_ids, marks.opens_inside)
        if self.jump_forward and not req.output_ids and not req.matcher.closing(req.params.max_new_tokens):
            forced = self._forced_tokens(req, b"", req.params.max_new_tokens)
            if forced and req.matcher.accept_tokens(forced):
                if req.matcher.budget_aware and req.params.max_new_tokens - len(forced) < req.matcher.distance():
                    req.matcher.rollback(len(forced))  # too many tokens for the budget: sample them instead
                else:
                    self._append_forced(req, forced)

    def apply_masks(self, reqs: list[Req], logits: torch.Tensor, ahead: list[list[int]]) -> None:
        """Set the logits of every token a request's grammar forbids to -inf, in place. Row i
        is masked for the state after reqs[i]'s output and then `ahead[i]` (guesses). Guesses
        under verification were cut by `valid_prefix`; a draft's guesses the grammar refuses
        (it ended) leave the row masked at the output's state, and verification cuts them."""
        rows = [i for i, r in enumerate(reqs) if r.matcher is not None]
        if not rows:
            return
        assert self.compiler is not None
        mask = np.empty((len(rows), self.compiler.tables.words), dtype=np.int32)
        for j, i in enumerate(rows):
            matcher = reqs[i].matcher
            assert matcher is not None  # rows are the constrained requests
            remaining = reqs[i].remaining_new_tokens - len(ahead[i])
            moved = bool(ahead[i]) and matcher.accept_tokens(ahead[i])
            start = time.perf_counter()
            matcher.fill_bitmask(mask[j], remaining)
            if time.perf_counter() - start > self.max_mask_s:
                reqs[i].grammar_too_slow = True  # `advance` ends it after this step's token
            if moved:
                matcher.rollback(len(ahead[i]))
        bitmask = torch.from_numpy(mask).to(logits.device)
        if len(rows) == len(reqs):
            _apply_bitmask(logits, bitmask)
            return
        index = torch.tensor(rows, device=logits.device)
        sub = logits[index]  # only the constrained rows are masked (and copied)
        _apply_bitmask(sub, bitmask)
        logits[index] = sub

    def valid_prefix(self, req: Req, guesses: list[int]) -> list[int]:
        """The longest run of `guesses` the request's grammar accepts from where it stands
        (none once the output is complete: only EOS may follow, and the mask gives it)."""
        matcher = req.matcher
        assert matcher is not None  # only a constrained request has guesses to check here
        if matcher.is_terminated():
            return []
        n = 0
        while n < len(guesses) and matcher.accept_token(guesses[n]):
            n += 1
        if n:
            matcher.rollback(n)
        return guesses[:n]

    def advance(self, req: Req, token: int) -> FinishAbort | None:
        """Feed the sampled token (already appended to output_ids); then jump forward where
        the grammar forces text. Returns the abort if the token was not allowed or the
        grammar's masks take too long."""
        matcher = req.matcher
        assert matcher is not None  # only a constrained request advances a grammar
        if req.grammar_too_slow:
            return FinishAbort(
                status_code=400,
                message=(
                    f"the grammar took longer than {self.max_mask_s * 1e3:g} ms to write one step's token mask (an "
                    "ambiguous grammar grows slower with the output); make it unambiguous, use --grammar-backend "
                    "llguidance, or raise --grammar-max-mask-ms"
                ),
            )
        if not matcher.accept_token(token):
            return FinishAbort(status_code=500, message=f"token {token} is not allowed by the grammar")
        if not self.jump_forward or matcher.is_terminated() or matcher.closing(req.remaining_new_tokens):
            return None  # closing under a budget: every token is chosen by the closing mask
        room = req.remaining_new_tokens + 1  # the sampled token is replaced too
        assert self.retokenizer is not None
        last = self.retokenizer.token_bytes[token] or b""
        forced = self._forced_tokens(req, last, room)
        if not forced or forced == [token]:
            return None
        matcher.rollback(1)
        if not matcher.accept_tokens(forced):
            matcher.accept_token(token)
            return None
        if matcher.budget_aware and req.remaining_new_tokens + 1 - len(forced) < matcher.distance():
            matcher.rollback(len(forced))  # the forced text's tokens would leave too few to close
            matcher.accept_token(token)
            return None
        req.output_ids.pop()
        first_logprob = req.logprobs.pop() if req.return_logprob and req.logprobs else None
        first_top = req.top_logprobs.pop() if req.top_logprobs_num and req.top_logprobs else None
        self._append_forced(req, forced, first_logprob, first_top)
        return None

    def _forced_tokens(self, req: Req, prefix: bytes, room: int) -> list[int]:
        """Tokens for `prefix` + the forced bytes of the matcher's state, at most `room`."""
        # Trailing spaces stay unforced: tokenizers glue a space to the word after it (" 6",
        # "▁6"), so the model samples that token instead of a lone space.
        assert req.matcher is not None
        forced = req.matcher.forced_bytes().rstrip(b" ")
        if not forced or room <= 0:
            return []
        assert self.retokenizer is not None
        return self.retokenizer.encode(prefix + forced)[:room]

    def _append_forced(
        self,
        req: Req,
        tokens: list[int],
        first_logprob: float | None = None,
        first_top: list[tuple[float, int]] | None = None,
    ) -> None:
        """Append forced tokens; their logprob is 0 (probability 1 under the grammar)."""
        for i, tok in enumerate(tokens):
            req.output_ids.append(tok)
            if req.return_logprob:
                req.logprobs.append(first_logprob if i == 0 and first_logprob is not None else 0.0)
                if req.top_logprobs_num:
                    req.top_logprobs.append(first_top if i == 0 and first_top is not None else [(0.0, tok)])


def _copy_result(src: Future[CompiledConstraint], dst: Future[CompiledConstraint]) -> None:
    if src.exception() is not None:
        dst.set_exception(src.exception())
    else:
        dst.set_result(src.result())


def _apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """In place: the Triton kernel on CUDA, the torch reference elsewhere."""
    if logits.is_cuda:
        from arbor.kernels.bitmask import apply_token_bitmask_triton  # Triton loads on the GPU only

        apply_token_bitmask_triton(logits, bitmask)
    else:
        apply_token_bitmask_ref(logits, bitmask)
