"""Soak: concurrent multi-turn chats whose total KV demand is four times the pool finish with
the outputs a roomy pool gives, nothing is lost, the KV invariant holds, and no stream waits
more than a few seconds for its next token."""

from __future__ import annotations

import threading
import time

import openai

from tests.server.conftest import start_server, stop_server

CONVERSATIONS, TURNS, ANSWER = 6, 4, 24
MAX_GAP_S = 5.0


def _chat(server, c: int, transcript: dict, gaps: list[float]) -> None:
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="test-key", max_retries=0, timeout=120)
    messages = [{"role": "user", "content": f"Conversation {c} begins with topic {c * 13}."}]
    for turn in range(TURNS):
        text, last = "", time.perf_counter()
        for chunk in client.chat.completions.create(
            model=server.model,
            messages=messages,
            max_tokens=ANSWER,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        ):
            now = time.perf_counter()
            gaps.append(now - last)
            last = now
            text += (chunk.choices[0].delta.content or "") if chunk.choices else ""
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": f"Turn {turn + 1}."}]
    transcript[c] = messages


def _trace(server) -> tuple[dict, list[float]]:
    transcript: dict = {}
    gaps: list[float] = []
    threads = [threading.Thread(target=_chat, args=(server, c, transcript, gaps)) for c in range(CONVERSATIONS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    return transcript, gaps


def test_chats_four_times_the_pool_finish_like_a_roomy_pool(tiny_model):
    path = str(tiny_model("llama"))
    roomy = start_server(path, "--api-key", "test-key")
    try:
        want, _ = _trace(roomy)
        roomy_stats = roomy.request("GET", "/get_server_info")[1]["stats"]
        demand = int(roomy_stats["prompt_tokens"]) + CONVERSATIONS * TURNS * ANSWER  # slots of all requests
    finally:
        stop_server(roomy)
    tight = start_server(path, "--api-key", "test-key", "--max-total-tokens", str(demand // 4))
    try:
        got, gaps = _trace(tight)
        stats = tight.request("GET", "/get_server_info")[1]["stats"]
    finally:
        stop_server(tight)
    assert len(got) == CONVERSATIONS and got == want
    assert stats["invariant_ok"] == 1.0 and stats["running"] == stats["waiting"] == 0
    assert stats["cached_tokens"] < roomy_stats["cached_tokens"]  # the tight pool had to evict
    assert max(gaps) < MAX_GAP_S
