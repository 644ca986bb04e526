"""Every program in examples/ runs against a live server and prints what it promises."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.frontend_lang.conftest import KEY

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _run(name: str, server) -> str:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name), "--url", server.base_url, "--api-key", KEY],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("name", ["react_agent.py", "tree_of_thought.py"])
def test_agent_examples_run(dsl_server, name) -> None:
    out = _run(name, dsl_server)
    assert ("answer:" in out) if name == "react_agent.py" else re.search(r"^9 leaves", out, re.M)
    if name == "react_agent.py":  # every action is a call to a known tool with fitting arguments
        calls = [json.loads(line.split(": ", 1)[1]) for line in out.splitlines() if line.startswith("Action ")]
        assert calls and all(c["name"] in ("calculate", "lookup", "finish") for c in calls), out
        assert all(
            set(c["arguments"])
            == ({"expression"} if c["name"] == "calculate" else {"term"} if c["name"] == "lookup" else {"answer"})
            for c in calls
        )


def test_json_extraction_outputs_parse(dsl_server) -> None:
    lines = _run("json_extraction.py", dsl_server).strip().splitlines()
    assert len(lines) == 4
    for line in lines:
        assert "vendor" in line and "currency" in line


def test_multi_turn_chat_hits_earlier_turns(dsl_server) -> None:
    out = _run("multi_turn_chat.py", dsl_server)
    cached = [int(m) for m in re.findall(r"(\d+) cached", out)]
    prompts = [int(m) for m in re.findall(r"prompt (\d+) tokens", out)]
    assert len(cached) == 4
    assert all(c >= p_prev for c, p_prev in zip(cached[1:], prompts[:-1])), (cached, prompts)
