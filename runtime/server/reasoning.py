"""Reasoning output (`--reasoning-parser`): the `<think>...</think>` section of an answer goes to
`reasoning_content`, the rest to `content`, whole or as stream deltas.

  qwen3        the section counts only when the answer opens with <think>
  deepseek-r1  the answer starts inside the section (the template wrote <think>); </think> ends it
An answer cut off inside the section is all reasoning.
"""

from __future__ import annotations

from dataclasses import dataclass

from arbor.grammar.reasoning_gate import THINK_END as END
from arbor.grammar.reasoning_gate import THINK_START as START

PARSERS = ("qwen3", "deepseek-r1")


@dataclass(frozen=True)
class ReasoningParser:
    opens_inside: bool  # the answer starts in the reasoning section

    def split(self, text: str) -> tuple[str, str]:
        """(reasoning, content) of a finished answer."""
        body = self._body(text)
        if body is None:
            return "", text
        reasoning, closed, content = body.partition(END)
        return reasoning.strip(), content.lstrip() if closed else ""

    def _body(self, text: str) -> str | None:
        """The text after the opening tag, or None if the answer has no reasoning section."""
        stripped = text.lstrip()
        if stripped.startswith(START):
            return stripped[len(START) :]
        return text if self.opens_inside else None


def make_reasoning_parser(name: str | None) -> ReasoningParser | None:
    return None if name is None else ReasoningParser(opens_inside=name == "deepseek-r1")


@dataclass
class ReasoningStream:
    """One streamed choice: which part of each new piece of text is reasoning and which is
    content. A piece that may be the start of a tag is held until the next one."""

    parser: ReasoningParser
    sent: int = 0  # characters of the text already handed out

    def step(self, text: str, done: bool) -> tuple[str, str]:
        """(new reasoning, new content), given the whole text so far."""
        stripped = text.lstrip()
        lead = len(text) - len(stripped)
        if not self.parser.opens_inside and not stripped.startswith(START):
            if not done and START.startswith(stripped):
                return "", ""  # may still become <think>
            return "", self._take(text, len(text))
        start = lead + len(START) if stripped.startswith(START) else 0
        if not done and not stripped.startswith(START) and START.startswith(stripped):
            return "", ""
        end = text.find(END, start)
        if end < 0:  # still reasoning: hold a possible partial </think>
            hold = next((k for k in range(min(len(END) - 1, len(text)), 0, -1) if END.startswith(text[-k:])), 0)
            upto = len(text) if done else len(text) - hold
            return self._take(text, upto, start), ""
        reasoning = self._take(text, end, start)
        self.sent = max(self.sent, end + len(END))
        return reasoning, self._take(text, len(text))

    def _take(self, text: str, upto: int, floor: int = 0) -> str:
        begin = max(self.sent, floor)
        piece = text[begin:upto] if upto > begin else ""
        self.sent = max(self.sent, upto)
        return piece
