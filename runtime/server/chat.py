"""Chat prompts whose earlier assistant turns keep the exact token ids the model produced.

Re-tokenizing generated text does not always give back the same ids (BPE has many spellings
of one string), and a different id breaks the radix-cache match for the rest of the
conversation. So the server remembers the ids behind each recent assistant text, renders
the checkpoint's chat template with a placeholder for each remembered turn, tokenizes the
template text between placeholders, and splices the remembered ids in. Earlier turns then
tokenize identically every time, and each new turn hits the previous turns' KV.
"""

from __future__ import annotations

import re
import secrets
from typing import Any

from arbor.runtime.server.answer_ids import MAX_BYTES, AnswerIds


class ChatTokenizer:
    """Applies the chat template and splices remembered assistant token ids (per tenant,
    bounded in bytes: AnswerIds)."""

    def __init__(self, tokenizer: Any, max_bytes: int = MAX_BYTES) -> None:
        self.tokenizer = tokenizer
        self._ids = AnswerIds(max_bytes)

    def remember(self, text: str, ids: list[int], tenant: str | None = None) -> None:
        """Record that the model produced `ids` for `tenant`'s assistant text `text`."""
        if text:
            self._ids.put(tenant, text, ids)

    def encode(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, tenant: str | None = None
    ) -> list[int]:
        """Token ids of the conversation (and the tools, which the template renders) followed
        by the assistant generation prompt; only `tenant`'s remembered answers are spliced."""
        # A fresh random mark per call: chat text cannot spell a placeholder, so whatever it
        # holds (private-use characters included) renders and tokenizes as the text it is.
        mark = f"\ue000{secrets.token_hex(8)}:"
        spliced: list[list[int]] = []
        rendered = []
        for m in messages:
            known = self._ids.get(tenant, m["content"]) if m["role"] == "assistant" and "tool_calls" not in m else None
            if known is not None:
                m = {**m, "content": f"{mark}{len(spliced)}\ue001"}
                spliced.append(known)
            rendered.append(m)
        try:
            text = self.tokenizer.apply_chat_template(rendered, tools=tools, tokenize=False, add_generation_prompt=True)
        except Exception as e:  # a template that rejects the conversation (e.g. role order)
            raise ValueError(f"the chat template cannot render these messages: {e}") from None
        ids: list[int] = []
        for i, piece in enumerate(re.split(re.escape(mark) + "(\\d+)\ue001", text)):
            if i % 2:
                ids += spliced[int(piece)]
            elif piece:
                ids += self.tokenizer.encode(piece, add_special_tokens=False)
        return ids


ROLES = ("system", "user", "assistant")
_SLOT = "\ue002"


def role_markers(tokenizer: Any) -> dict[str, list[str]] | None:
    """The text the checkpoint's chat template puts before and after one message of each
    role ({"user": [prefix, suffix], ...}), for clients that build chat prompts as text (the
    DSL). A leading BOS is left out: tokenizing the prompt adds it. None without a template;
    a role the template refuses (some have no system role) is missing."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    bos = getattr(tokenizer, "bos_token", None) or ""
    out: dict[str, list[str]] = {}
    for role in ROLES:
        try:
            text = tokenizer.apply_chat_template([{"role": role, "content": _SLOT}], tokenize=False)
        except Exception:  # Jinja templates raise anything for a role they refuse
            continue
        prefix, _, suffix = text.partition(_SLOT)
        out[role] = [prefix.removeprefix(bos) if bos else prefix, suffix]
    return out
