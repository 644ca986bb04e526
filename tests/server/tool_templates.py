"""Chat templates that carry tools, one per tool-call format: the tiny checkpoints' template
plus a tools block, assistant tool calls written in the family's format, and tool turns.
A checkpoint with one of them stands in for a model family whose template renders tools."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

_ARGS = "c.function.arguments | tojson"
CALLS = {
    "qwen25": '{% for c in m.tool_calls %}<tool_call>\n{"name": "{{ c.function.name }}", "arguments": '
    "{{ " + _ARGS + " }}}\n</tool_call>{% endfor %}",
    "llama3": '{% for c in m.tool_calls %}{% if not loop.first %}; {% endif %}{"name": "{{ c.function.name }}", '
    '"parameters": {{ ' + _ARGS + " }}}{% endfor %}",
    "mistral": '[TOOL_CALLS] [{% for c in m.tool_calls %}{% if not loop.first %}, {% endif %}{"name": '
    '"{{ c.function.name }}", "arguments": {{ ' + _ARGS + " }}}{% endfor %}]",
    "pythonic": "[{% for c in m.tool_calls %}{% if not loop.first %}, {% endif %}{{ c.function.name }}("
    "{% for k, v in c.function.arguments.items() %}{% if not loop.first %}, {% endif %}"
    "{{ k }}={{ v | tojson }}{% endfor %}){% endfor %}]",
}


def template(fmt: str) -> str:
    return (
        "{% if tools %}<|system|>\nYou may call these functions:\n"
        "{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|endoftext|>\n{% endif %}"
        "{% for m in messages %}"
        "{% if m.role == 'tool' %}<|tool|>\n{{ m.content }}<|endoftext|>\n"
        "{% elif m.role == 'assistant' and m.tool_calls %}<|assistant|>\n{{ m.content or '' }}"
        + CALLS[fmt]
        + "<|endoftext|>\n"
        "{% else %}<|{{ m.role }}|>\n{{ m.content }}<|endoftext|>\n{% endif %}"
        "{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
    )


def with_tool_template(checkpoint: Path, out: Path, fmt: str) -> Path:
    """A copy of `checkpoint` whose chat template renders tools in format `fmt`."""
    if not (out / "config.json").exists():
        shutil.copytree(checkpoint, out, dirs_exist_ok=True)
        config_path = out / "tokenizer_config.json"
        config = json.loads(config_path.read_text())
        config["chat_template"] = template(fmt)
        config_path.write_text(json.dumps(config, indent=2))
    return out
