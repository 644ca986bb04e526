"""Chat templates as text: what goes before and after a message of each role.

A backend takes its template from the checkpoint (the server renders the Hugging Face chat
template and reports the markers in /get_model_info), or from this registry by name for plain
completion endpoints.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ChatTemplate:
    """Per-role (prefix, suffix) text around a message's content."""

    name: str
    roles: dict[str, tuple[str, str]]  # role -> (prefix, suffix)

    def prefix(self, role: str) -> str:
        """Text before a `role` message's content."""
        return self._markers(role)[0]

    def suffix(self, role: str) -> str:
        """Text after a `role` message's content."""
        return self._markers(role)[1]

    def _markers(self, role: str) -> tuple[str, str]:
        if role not in self.roles:
            raise ValueError(f"chat template {self.name!r} has no {role!r} role; it has {', '.join(self.roles)}")
        return self.roles[role]

    @classmethod
    def from_markers(cls, name: str, markers: dict[str, list[str]]) -> ChatTemplate:
        """From /get_model_info's `chat_roles` ({role: [prefix, suffix]})."""
        return cls(name, {role: (pair[0], pair[1]) for role, pair in markers.items()})


TEMPLATES = {
    "default": ChatTemplate(
        "default", {"system": ("SYSTEM: ", "\n"), "user": ("USER: ", "\n"), "assistant": ("ASSISTANT: ", "\n")}
    ),
    "chatml": ChatTemplate(
        "chatml", {r: (f"<|im_start|>{r}\n", "<|im_end|>\n") for r in ("system", "user", "assistant")}
    ),
    "llama-3-instruct": ChatTemplate(
        "llama-3-instruct",
        {r: (f"<|start_header_id|>{r}<|end_header_id|>\n\n", "<|eot_id|>") for r in ("system", "user", "assistant")},
    ),
}


def get_chat_template(name: str) -> ChatTemplate:
    """A template of the registry by name."""
    if name not in TEMPLATES:
        raise ValueError(f"unknown chat template {name!r}; known: {', '.join(TEMPLATES)}")
    return TEMPLATES[name]
