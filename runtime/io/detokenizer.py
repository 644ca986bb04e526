"""Detokenizer process: token ids -> text increments, UTF-8 safe, with stop-string trimming."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

import zmq

from arbor.grammar.linear_regex import compile_linear
from arbor.runtime.io.heartbeat import Heartbeat
from arbor.runtime.io.ipc import Puller, Pusher
from arbor.runtime.io.messages import (
    AbortReq,
    BatchTextOut,
    BatchTokenOut,
    FinishReason,
    FinishStop,
    OutputOptions,
    ProcessError,
    Ready,
    ReqOut,
    ShutdownReq,
    Stats,
    TextOut,
    ToDetokenizer,
    unpack_ids,
)
from arbor.runtime.io.tokenizer import load_tokenizer

logger = logging.getLogger(__name__)
HOLD_BACK = "\ufffd"  # an incomplete UTF-8 sequence decodes to this


@dataclass
class _Stream:
    ids: list[int] = field(default_factory=list)
    prefix_offset: int = 0
    read_offset: int = 0
    text: str = ""  # decoded so far
    sent: int = 0  # characters of `text` already sent
    scanned: int = 0  # characters of `text` already searched for stop strings
    regexes: list[Any] = field(default_factory=list)  # the stop regexes, compiled by RE2 once per request


class IncrementalDetokenizer:
    """Per-request decode state; `feed` turns a step's token outputs into text outputs.

    Text is decoded over a short window of recent ids, so a multi-byte character split
    across tokens is only emitted once complete. A request's stop strings and regexes end it
    at their first match (the match is cut unless `no_stop_trim`). Each step searches only
    the new text and the tail before it that a match could still start in, with RE2, so a
    step's stop search takes time linear in that window, never in the whole output.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.streams: dict[str, _Stream] = {}
        self.ended: set[str] = set()

    def feed(self, outs: list[ReqOut]) -> tuple[list[TextOut], list[str]]:
        """Text outputs for this step, and rids that a stop string ended (to abort upstream)."""
        texts, stopped = [], []
        for out in outs:
            if out.rid in self.ended:
                if out.finish_reason is not None:
                    self.ended.discard(out.rid)
                continue
            opts = out.output
            s = self.streams.get(out.rid) or self._open(out.rid, opts)
            new_ids = unpack_ids(out.new_ids).tolist()
            s.ids += new_ids
            reason = out.finish_reason
            self._decode(s, opts, reason)
            hit = _find_stop(s, opts)
            if hit is not None:
                start, end, matched = hit
                s.text = s.text[: end if opts.no_stop_trim else start]
                reason = FinishStop(matched=matched)
                if out.finish_reason is None:
                    stopped.append(out.rid)
                    self.ended.add(out.rid)
            hold = 0 if reason is not None else max([len(x) - 1 for x in opts.stop] + [opts.stop_regex_max_len - 1, 0])
            upto = max(s.sent, len(s.text) - hold)
            delta, s.sent = s.text[s.sent : upto], upto
            texts.append(
                TextOut(
                    rid=out.rid,
                    text=delta,
                    output_ids=new_ids,
                    finish_reason=reason,
                    prompt_tokens=out.prompt_tokens,
                    completion_tokens=out.completion_tokens,
                    cached_tokens=out.cached_tokens,
                    spec_verify_ct=out.spec_verify_ct,
                    logprobs=out.logprobs,
                    top_logprobs=out.top_logprobs,
                    input_logprobs=out.input_logprobs,
                    input_top_logprobs=out.input_top_logprobs,
                )
            )
            if reason is not None:
                del self.streams[out.rid]
        return texts, stopped

    def _open(self, rid: str, opts: OutputOptions) -> _Stream:
        # The front door validated the patterns with the same compile_linear: this cannot raise.
        s = self.streams[rid] = _Stream(regexes=[compile_linear(p, "stop_regex") for p in opts.stop_regex])
        return s

    def _decode(self, s: _Stream, opts: OutputOptions, reason: FinishReason | None) -> None:
        def decode(ids: list[int]) -> str:
            return self.tokenizer.decode(
                ids,
                skip_special_tokens=opts.skip_special_tokens,
                spaces_between_special_tokens=opts.spaces_between_special_tokens,
            )

        if reason is not None:
            ids = s.ids
            if isinstance(reason, FinishStop) and isinstance(reason.matched, int) and not opts.no_stop_trim:
                ids = ids[:-1]  # the stop token is not part of the text (SGLang trims it too)
            s.text = decode(ids)
            return
        prefix = decode(s.ids[s.prefix_offset : s.read_offset])
        window = decode(s.ids[s.prefix_offset :])
        if len(window) > len(prefix) and not window.endswith(HOLD_BACK):
            s.text += window[len(prefix) :]
            s.prefix_offset, s.read_offset = s.read_offset, len(s.ids)


def _find_stop(s: _Stream, opts: OutputOptions) -> tuple[int, int, str] | None:
    """The first stop string or regex match starting in the window: the text not yet scanned
    and the scanned tail before it, as long as the longest stop string or regex match
    (stop_regex_max_len, capped): (start, end, matched text)."""
    if not opts.scans_text:
        return None
    back = max([len(x) for x in opts.stop] + [opts.stop_regex_max_len])
    start = max(0, s.scanned - back)
    s.scanned = len(s.text)
    hits = [(i, i + len(x), x) for x in opts.stop if (i := s.text.find(x, start)) >= 0]
    if s.regexes:
        # One character before the window keeps ^, \b and (?m)^ as they are on the whole text;
        # RE2 converts the text it gets to UTF-8, so it gets the window, not the output.
        context = max(0, start - 1)
        window = s.text[context:]
        for regex in s.regexes:
            m = regex.search(window, start - context)
            if m is not None:
                hits.append((context + m.start(), context + m.end(), m.group(0)))
    return min(hits) if hits else None


def run_detokenizer(tokenizer_path: str, endpoints: dict[str, str], heartbeat: Heartbeat) -> None:
    """Process entry: detokenize until a ShutdownReq, or until the parent process is gone;
    `heartbeat` beats each time the loop comes around (at least every second)."""
    logging.basicConfig(level=logging.INFO, format="[detokenizer] %(levelname)s %(message)s")
    ctx = zmq.Context()
    inbox = Puller(ctx, endpoints["detokenizer"], ToDetokenizer)
    front = Pusher(ctx, endpoints["front"])
    scheduler = Pusher(ctx, endpoints["scheduler"])
    parent = os.getppid()
    try:
        detok = IncrementalDetokenizer(load_tokenizer(tokenizer_path))
    except Exception as exc:  # reported to the front door, which fails start-up with it
        front.send(ProcessError(process="detokenizer", message=f"{type(exc).__name__}: {exc}"))
        return
    front.send(Ready(process="detokenizer"))
    try:
        while True:
            heartbeat.beat()
            msg = inbox.recv(timeout_ms=1000)
            if msg is None:
                if os.getppid() != parent:
                    return
                continue
            if isinstance(msg, BatchTokenOut):
                texts, stopped = detok.feed(msg.outs)
                for rid in stopped:
                    scheduler.send(AbortReq(rid=rid))
                if texts:
                    front.send(BatchTextOut(outs=texts))
            elif isinstance(msg, (Ready, Stats)):
                front.send(msg)
            elif isinstance(msg, ShutdownReq):
                return
    finally:
        for sock in (inbox, front, scheduler):
            sock.close()
        ctx.term()
