"""Detokenizer process: token ids -> text increments, UTF-8 safe, with stop-string trimming."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

import zmq

from arbor.runtime.ipc import Puller, Pusher
from arbor.runtime.messages import (
    AbortReq,
    BatchTextOut,
    BatchTokenOut,
    ProcessError,
    Ready,
    ReqOut,
    ShutdownReq,
    Stats,
    TextOut,
    ToDetokenizer,
    unpack_ids,
)

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


class IncrementalDetokenizer:
    """Per-request decode state; `feed` turns a step's token outputs into text outputs.

    Text is decoded over a short window of recent ids, so a multi-byte character split
    across tokens is only emitted once complete. A request's stop strings end it at their
    first occurrence (the stop string itself is not returned).
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
            s = self.streams.setdefault(out.rid, _Stream())
            new_ids = unpack_ids(out.new_ids).tolist()
            s.ids += new_ids
            self._decode(s, final=out.finish_reason is not None)
            reason = out.finish_reason
            hit = _find_stop(s, out.stop)
            if hit is not None:
                s.text = s.text[: hit[0]]
                reason = {"type": "stop", "matched": hit[1]}
                if out.finish_reason is None:
                    stopped.append(out.rid)
                    self.ended.add(out.rid)
            hold = 0 if reason is not None else max((len(x) - 1 for x in out.stop), default=0)
            upto = max(s.sent, len(s.text) - hold)
            delta, s.sent = s.text[s.sent : upto], upto
            texts.append(TextOut(
                rid=out.rid, text=delta, output_ids=new_ids, finish_reason=reason,
                prompt_tokens=out.prompt_tokens, completion_tokens=out.completion_tokens,
                cached_tokens=out.cached_tokens, logprobs=out.logprobs, top_logprobs=out.top_logprobs,
                input_logprobs=out.input_logprobs, input_top_logprobs=out.input_top_logprobs,
            ))
            if reason is not None:
                del self.streams[out.rid]
        return texts, stopped

    def _decode(self, s: _Stream, final: bool) -> None:
        decode = self.tokenizer.decode
        if final:
            s.text = decode(s.ids, skip_special_tokens=True)
            return
        prefix = decode(s.ids[s.prefix_offset : s.read_offset], skip_special_tokens=True)
        window = decode(s.ids[s.prefix_offset :], skip_special_tokens=True)
        if len(window) > len(prefix) and not window.endswith(HOLD_BACK):
            s.text += window[len(prefix) :]
            s.prefix_offset, s.read_offset = s.read_offset, len(s.ids)


def _find_stop(s: _Stream, stops: list[str]) -> tuple[int, str] | None:
    """First stop string in the text not yet scanned (overlapping the scanned tail)."""
    if not stops:
        return None
    start = max(0, s.scanned - max(len(x) for x in stops))
    s.scanned = len(s.text)
    hits = [(i, x) for x in stops if (i := s.text.find(x, start)) >= 0]
    return min(hits) if hits else None


def run_detokenizer(tokenizer_path: str, endpoints: dict[str, str]) -> None:
    """Process entry: detokenize until a ShutdownReq, or until the parent process is gone."""
    logging.basicConfig(level=logging.INFO, format="[detokenizer] %(levelname)s %(message)s")
    ctx = zmq.Context()
    inbox = Puller(ctx, endpoints["detokenizer"], ToDetokenizer)
    front = Pusher(ctx, endpoints["front"])
    scheduler = Pusher(ctx, endpoints["scheduler"])
    parent = os.getppid()
    try:
        from transformers import AutoTokenizer

        detok = IncrementalDetokenizer(AutoTokenizer.from_pretrained(tokenizer_path, local_files_only=True))
    except Exception as exc:  # reported to the front door, which fails start-up with it
        front.send(ProcessError(process="detokenizer", message=f"{type(exc).__name__}: {exc}"))
        return
    front.send(Ready(process="detokenizer"))
    try:
        while True:
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
