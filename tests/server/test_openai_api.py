"""The OpenAI-compatible API, driven by the official `openai` client against a live server."""

from __future__ import annotations

import openai
import pytest


def test_models_lists_the_served_checkpoint(client, server):
    models = client.models.list()
    assert [m.id for m in models.data] == [server.model]


def test_chat_completion_and_usage(client, server):
    resp = client.chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": "Hi"}], max_tokens=8, temperature=0
    )
    choice = resp.choices[0]
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    assert resp.usage.completion_tokens <= 8 and resp.usage.prompt_tokens > 0
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    assert resp.id.startswith("chatcmpl-") and resp.object == "chat.completion"


def test_streaming_chat_equals_non_streaming_and_reports_usage(client, server):
    messages = [{"role": "user", "content": "Tell me a story"}]
    full = client.chat.completions.create(model=server.model, messages=messages, max_tokens=16, temperature=0)
    chunks = list(
        client.chat.completions.create(
            model=server.model,
            messages=messages,
            max_tokens=16,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [full.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_batched_completions_with_n(client, server):
    resp = client.completions.create(
        model=server.model, prompt=["Once", "Twice"], max_tokens=5, n=2, temperature=1.0, seed=1
    )
    assert sorted(c.index for c in resp.choices) == [0, 1, 2, 3]
    assert 4 <= resp.usage.completion_tokens <= 20  # every choice counts, each 1-5 tokens
    chat = client.chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": "x"}], max_tokens=4, n=2, temperature=1.0
    )
    assert [c.index for c in chat.choices] == [0, 1]


def test_max_tokens_gives_finish_reason_length(client, server):
    resp = client.completions.create(
        model=server.model, prompt="Hello", max_tokens=7, temperature=0, extra_body={"ignore_eos": True}
    )
    assert resp.choices[0].finish_reason == "length" and resp.usage.completion_tokens == 7


def test_stop_sequence_cuts_the_text(client, server):
    base = (
        client.completions.create(
            model=server.model, prompt="Once upon", max_tokens=24, temperature=0, extra_body={"ignore_eos": True}
        )
        .choices[0]
        .text
    )
    stop = base[len(base) // 2 : len(base) // 2 + 3]
    cut = client.completions.create(
        model=server.model,
        prompt="Once upon",
        max_tokens=24,
        temperature=0,
        stop=[stop],
        extra_body={"ignore_eos": True},
    ).choices[0]
    assert cut.text == base[: base.find(stop)] and cut.finish_reason == "stop"


def test_logprobs_in_both_apis(client, server):
    comp = client.completions.create(
        model=server.model, prompt="Hello", max_tokens=4, temperature=0, logprobs=2, extra_body={"ignore_eos": True}
    )
    lp = comp.choices[0].logprobs
    assert len(lp.tokens) == 4 and "".join(lp.tokens) == comp.choices[0].text
    assert all(len(t) <= 2 for t in lp.top_logprobs) and all(x <= 0 for x in lp.token_logprobs)
    assert lp.text_offset[0] == 0
    chat = client.chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
        extra_body={"ignore_eos": True},
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == 4 and all(len(c.top_logprobs) == 3 for c in content)
    assert all(c.top_logprobs[0].logprob >= c.logprob - 1e-6 for c in content)  # greedy picks the top token


def test_seed_reproduces_sampling(client, server):
    def sample(seed):
        return (
            client.completions.create(
                model=server.model,
                prompt="Seeded",
                max_tokens=12,
                temperature=1.0,
                seed=seed,
                extra_body={"ignore_eos": True},
            )
            .choices[0]
            .text
        )

    assert sample(7) == sample(7)
    assert len({sample(s) for s in (1, 2, 3)}) > 1


def test_multi_turn_chat_reuses_previous_turns(client, server):
    messages = [{"role": "system", "content": "You are a terse assistant."}]
    previous_total = 0
    for turn in range(4):
        messages.append({"role": "user", "content": f"Question number {turn}?"})
        resp = client.chat.completions.create(
            model=server.model,
            messages=messages,
            max_tokens=12,
            temperature=0,
            extra_body={"cache_salt": "multi-turn-test"},
        )
        if turn:
            # everything of the earlier turns is cached, except the final token of the last answer
            assert resp.usage.prompt_tokens_details.cached_tokens >= previous_total - 1
        previous_total = resp.usage.prompt_tokens + resp.usage.completion_tokens
        messages.append({"role": "assistant", "content": resp.choices[0].message.content})


def test_errors_come_in_openai_shape(client, server):
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="max_tokens must be >= 1"):
        client.completions.create(model=server.model, prompt="x", max_tokens=0)
    bad = openai.OpenAI(base_url=server.base_url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_cached_tokens_are_reported_only_with_enable_cache_report(launch):
    import openai

    server = launch()
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0)
    for _ in range(2):
        reply = client.completions.create(model=server.model, prompt="the same prompt twice", max_tokens=2)
    assert reply.usage.prompt_tokens_details is None
