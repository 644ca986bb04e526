"""The unmodified sglang-router (cache_aware policy) fronts two Arbor workers: native,
OpenAI-completions and chat traffic pass through it, streamed and not, and a multi-turn chat
keeps the prefix cache hits it would have on one worker."""

from __future__ import annotations

import json

import openai
import pytest

from tests.ecosystem.conftest import Router, chat_trace


@pytest.fixture(scope="module")
def client(router: Router) -> openai.OpenAI:
    return openai.OpenAI(base_url=router.url + "/v1", api_key="none", max_retries=0)


def test_router_lists_the_served_model(client, router):
    assert [m.id for m in client.models.list().data] == [router.workers[0].model]


def test_native_generate_through_the_router(router):
    front = router.front
    status, out = front.request(
        "POST", "/generate", {"text": "Hello", "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
    )
    assert status == 200, out
    assert out["meta_info"]["completion_tokens"] == 8 and out["meta_info"]["finish_reason"]["type"] == "length"
    direct = router.workers[0].request(
        "POST", "/generate", {"text": "Hello", "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
    )[1]
    assert out["output_ids"] == direct["output_ids"]
    events = front.sse(
        "/generate", {"text": "Hello", "stream": True, "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
    )
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["text"] == out["text"]


def test_batch_generate_carries_logprobs(router):
    # The router refuses batched /generate bodies itself (422), so this one goes to a worker.
    status, outs = router.workers[0].request(
        "POST", "/generate", {"text": ["one", "two"], "sampling_params": {"max_new_tokens": 3}, "return_logprob": True}
    )
    assert status == 200, outs
    for out in outs:
        meta = out["meta_info"]
        assert len(meta["output_token_logprobs"]) == 3 and meta["input_token_logprobs"] == []


def test_completions_through_the_router(client, router):
    model = router.workers[0].model
    reply = client.completions.create(model=model, prompt="Once", max_tokens=6, temperature=0)
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 6
    chunks = list(client.completions.create(model=model, prompt="Once", max_tokens=6, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == reply.choices[0].text


def test_chat_through_the_router_with_and_without_max_tokens(client, router):
    model = router.workers[0].model
    messages = [{"role": "user", "content": "Say something."}]
    reply = client.chat.completions.create(model=model, messages=messages, max_tokens=6, temperature=0)
    assert reply.choices[0].finish_reason == "length"
    chunks = client.chat.completions.create(model=model, messages=messages, max_tokens=6, temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == reply.choices[0].message.content
    # No max_tokens, the most common call there is: it runs until EOS or the context is full.
    bare = client.chat.completions.create(model=model, messages=messages)
    context = router.workers[0].request("GET", "/get_model_info")[1]["context_length"]
    assert bare.choices[0].finish_reason in ("stop", "length")
    assert bare.usage.prompt_tokens + bare.usage.completion_tokens <= context


def test_multi_turn_chats_keep_their_cache_hits_through_the_router(client, router):
    model = router.workers[0].model
    for w in router.workers:
        w.request("POST", "/flush_cache")
    through_router = chat_trace(client, model)
    for w in router.workers:
        w.request("POST", "/flush_cache")
    one_worker = openai.OpenAI(base_url=router.workers[0].base_url + "/v1", api_key="none", max_retries=0)
    alone = chat_trace(one_worker, model)
    assert all(hits[1] > 0 for hits in alone)
    assert through_router == alone  # every later turn landed where its conversation's KV was
