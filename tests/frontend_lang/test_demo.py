"""`arbor demo`, the README's first command, runs the whole tour and stops its server."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import jsonschema

from arbor.frontend_lang.demo import CITY, TOOL_CALL


def test_demo_runs_the_product_tour(tiny_model) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "arbor",
            "demo",
            "--model-path",
            str(tiny_model("llama")),
            "--dtype",
            "float32",
            "--log-level",
            "warning",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "random weights" in out and "--model-path" in out
    assert re.search(r"action:\s+'(search|calculator|finish)'", out)
    call = re.search(r"call:\s+(\{.*\})\s+\(json_schema", out).group(1)
    jsonschema.validate(json.loads(call), TOOL_CALL)
    assert re.search(r"ideas:\s+\[.*\]\s+\(fork of 3\)", out)
    assert "7 chat messages" in out
    city = out.split("response_format json_schema:\n", 1)[1].splitlines()[0].strip()
    jsonschema.validate(json.loads(city), CITY)
    assert re.search(r"TTFT \d+ ms, TPOT [\d.]+ ms", out)
    assert float(re.search(r"hit rate: ([\d.]+)%", out).group(1)) > 0
