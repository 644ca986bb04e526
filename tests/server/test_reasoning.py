"""--reasoning-parser: the <think> section goes to reasoning_content, whole and streamed, through
the official openai client; separate_reasoning=false leaves it in content."""

from __future__ import annotations

import openai
import pytest

from arbor.runtime.server.reasoning import ReasoningStream, make_reasoning_parser

THINK = r"<think>[a-z]{3,8}( [a-z]{3,8}){1,3}</think>[A-Z][a-z]{2,8}"  # forces a reasoning-shaped answer


@pytest.mark.parametrize(
    ("name", "text", "reasoning", "content"),
    [
        ("qwen3", "<think>\nplan it\n</think>\n\nAnswer.", "plan it", "Answer."),
        ("qwen3", "No thinking here.", "", "No thinking here."),
        ("qwen3", "<think>cut off mid", "cut off mid", ""),
        ("deepseek-r1", "plan it</think>Answer.", "plan it", "Answer."),
        ("deepseek-r1", "<think>plan</think>Answer.", "plan", "Answer."),
    ],
)
def test_split(name, text, reasoning, content):
    assert make_reasoning_parser(name).split(text) == (reasoning, content)


@pytest.mark.parametrize("name", ["qwen3", "deepseek-r1"])
@pytest.mark.parametrize("text", ["<think>a plan</think>Answer.", "plain answer <b>", "<th", "x</think>y"])
def test_stream_pieces_add_up_to_the_split(name, text):
    """Fed one character at a time, the stream hands out what the whole split gives
    (up to the whitespace the split strips)."""
    parser = make_reasoning_parser(name)
    stream = ReasoningStream(parser)
    reasoning = content = ""
    for n in range(1, len(text) + 1):
        r, c = stream.step(text[:n], n == len(text))
        reasoning, content = reasoning + r, content + c
    assert (reasoning.strip(), content.lstrip()) == parser.split(text)


@pytest.fixture(scope="module")
def reasoning_server(tiny_model):
    from tests.server.conftest import start_server, stop_server

    server = start_server(str(tiny_model("llama")), "--reasoning-parser", "qwen3")
    yield server, openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
    stop_server(server)


def test_reasoning_content_through_the_openai_client(reasoning_server):
    server, client = reasoning_server
    ask = {
        "model": server.model,
        "messages": [{"role": "user", "content": "Why?"}],
        "max_tokens": 80,
        "extra_body": {"regex": THINK},
    }
    whole = client.chat.completions.create(**ask, temperature=0)
    message = whole.choices[0].message
    reasoning = message.model_extra["reasoning_content"]
    assert reasoning and "<think>" not in reasoning and message.content and "</think>" not in message.content
    streamed_r = streamed_c = ""
    for chunk in client.chat.completions.create(**ask, temperature=0, stream=True):
        delta = chunk.choices[0].delta
        streamed_r += (delta.model_extra or {}).get("reasoning_content") or ""
        streamed_c += delta.content or ""
    assert (streamed_r.strip(), streamed_c.strip()) == (reasoning, message.content)
    joined = client.chat.completions.create(
        **{**ask, "extra_body": {"regex": THINK, "separate_reasoning": False}}, temperature=0
    )
    assert joined.choices[0].message.content.startswith("<think>")


def test_require_reasoning_constrains_the_answer_after_the_section(tiny_model):
    import json

    from tests.server.conftest import start_server, stop_server

    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    server = start_server(str(tiny_model("llama")), "--reasoning-parser", "deepseek-r1")
    try:
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
        for seed in range(3):
            reply = client.chat.completions.create(
                model=server.model,
                messages=[{"role": "user", "content": "Is it?"}],
                max_tokens=30,
                seed=seed,
                temperature=1.0,
                response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
                extra_body={"require_reasoning": True},
            )
            message = reply.choices[0].message
            # A random model never closes its section: the budget closes it, then the JSON.
            assert message.model_extra["reasoning_content"], message
            assert json.loads(message.content) in ({"ok": True}, {"ok": False}), message
        status, out = server.request(
            "POST",
            "/generate",
            {
                "text": "Q",
                "require_reasoning": True,
                "sampling_params": {"json_schema": schema, "max_new_tokens": 20, "temperature": 1.0, "seed": 1},
            },
        )
        assert status == 200 and "</think>" in out["text"], out
        assert json.loads(out["text"].split("</think>", 1)[1]) in ({"ok": True}, {"ok": False}), out
    finally:
        stop_server(server)


def test_require_reasoning_without_a_parser_is_a_400(server):
    status, out = server.request(
        "POST", "/generate", {"text": "Q", "require_reasoning": True, "sampling_params": {"regex": "[ab]"}}
    )
    assert status == 400 and "--reasoning-parser" in out["error"]["message"], out
