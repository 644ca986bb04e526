"""--tp-size 2 end to end, in real processes over gloo: the Engine and `arbor serve` (native
and OpenAI APIs) give the single-process greedy tokens with cache hits, chunked prefill, a
regex constraint and a pool small enough to retract; killing a rank makes the server exit non-zero, naming it."""

from __future__ import annotations

import re
import subprocess
import time

from arbor import Engine
from tests.server.conftest import start_server, stop_server

PROMPTS = [[5, 17, 99, 3, 250, 8, 8, 41], [7] * 3, list(range(30, 90)), [*range(30, 70), 1, 2]]
GREEDY = {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}
REGEX = r"[0-9]{3}-[a-z]{2}"


def _engine_outputs(path: str, tp: int) -> list[list[int]]:
    with Engine(path, dtype="float32", tp_size=tp, max_total_tokens=200, chunked_prefill_size=16) as engine:
        batch = [o["output_ids"] for o in engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)]
        again = engine.generate(input_ids=PROMPTS[3], sampling_params=GREEDY)  # a radix-cache hit
        assert again["meta_info"]["cached_tokens"] > 0
        # Grammar masks are applied once, to rank 0's gathered logits.
        constrained = engine.generate(
            prompt="Code:", sampling_params={"regex": REGEX, "max_new_tokens": 16, "temperature": 0}
        )
        assert re.fullmatch(REGEX, constrained["text"])
        return [*batch, again["output_ids"], constrained["output_ids"]]


def test_engine_with_two_ranks_matches_one(tiny_model) -> None:
    path = str(tiny_model("llama-tied-gqa4"))
    assert _engine_outputs(path, 2) == _engine_outputs(path, 1)


def test_server_with_two_ranks_matches_one_and_exits_when_a_rank_dies(tiny_model) -> None:
    path = str(tiny_model("llama"))
    outputs = {}
    for tp in (1, 2):
        server = start_server(path, "--tp-size", str(tp), "--chunked-prefill-size", "16")
        try:
            native = server.request("POST", "/generate", {"input_ids": PROMPTS, "sampling_params": GREEDY})[1]
            status, chat = server.request(
                "POST",
                "/v1/completions",
                {"model": server.model, "prompt": PROMPTS[2], "max_tokens": 16, "temperature": 0},
            )
            assert status == 200
            outputs[tp] = ([o["output_ids"] for o in native], chat["choices"][0]["text"])
            if tp == 2:
                rank1 = subprocess.run(
                    ["pgrep", "-P", str(server.proc.pid), "-f", "tp_worker"], capture_output=True, text=True
                ).stdout.split()
                assert len(rank1) == 1
                subprocess.run(["kill", "-9", rank1[0]], check=True)
                deadline = time.monotonic() + 30
                while server.proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.2)
                assert server.proc.returncode not in (None, 0)
        finally:
            stop_server(server)
    assert outputs[2] == outputs[1]
