"""One chat choice's text split into reasoning, content and tool calls: whole for a response,
piece by piece for a stream. Reasoning comes first; tool calls are looked for in the content."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from arbor.runtime.server.reasoning import ReasoningParser, ReasoningStream
from arbor.runtime.server.tools import ToolPlan, ToolStream, wire_calls


@dataclass
class AnswerShape:
    """What to split out of an answer (None: nothing of that kind)."""

    reasoning: ReasoningParser | None = None
    tools: ToolPlan | None = None
    stream_reasoning: bool = True  # False: a stream sends the reasoning in one piece, at its end

    def message(self, text: str, reason: str | None) -> tuple[dict[str, Any], str | None]:
        """The response message of a finished answer, and its finish reason."""
        reasoning, content = self.reasoning.split(text) if self.reasoning is not None else ("", text)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if self.reasoning is not None:
            message["reasoning_content"] = reasoning or None
        if self.tools is not None:
            end, calls = self.tools.split(content)
            if calls:
                message["content"] = content[:end].strip() or None
                message["tool_calls"] = wire_calls(calls)
                reason = self.tools.finish(reason, calls)
        return message, reason


@dataclass
class AnswerStream:
    """One streamed choice. `step` gives the deltas of each new event; after the last one,
    `tool_deltas` and `finish` the tool calls found."""

    shape: AnswerShape
    content: str = ""  # content so far (what the tool split reads)
    held_reasoning: str = ""
    _reasoning: ReasoningStream | None = None
    _tools: ToolStream | None = None

    def __post_init__(self) -> None:
        if self.shape.reasoning is not None:
            self._reasoning = ReasoningStream(self.shape.reasoning)
        if self.shape.tools is not None:
            self._tools = ToolStream(self.shape.tools)

    def step(self, text: str, done: bool) -> dict[str, Any]:
        """The delta fields ({"reasoning_content", "content", "tool_calls"}) for the text so far."""
        if self._reasoning is not None:
            reasoning, new = self._reasoning.step(text, done)
        else:
            reasoning, new = "", text[len(self.content) :]
        self.content += new
        out: dict[str, Any] = {}
        if not self.shape.stream_reasoning:
            self.held_reasoning += reasoning
            reasoning = self.held_reasoning if done else ""
        if reasoning:
            out["reasoning_content"] = reasoning
        calls = self._tools.progress(self.content) if self._tools is not None else []
        content = self._tools.step(self.content, done) if self._tools is not None else new
        if content:
            out["content"] = content
        if calls:
            out["tool_calls"] = calls
        return out

    def tool_deltas(self) -> list[dict[str, Any]]:
        return self._tools.deltas() if self._tools is not None else []

    def finish(self, reason: str) -> str | None:
        if self._tools is not None and self._tools.calls:
            assert self.shape.tools is not None
            return self.shape.tools.finish(reason, self._tools.calls)
        return reason
