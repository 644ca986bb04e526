"""Constrained output over HTTP: OpenAI response_format with the official client, and the
native regex / json_schema / choices sampling parameters."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "population": {"type": "integer", "minimum": 0},
        "capital": {"type": "boolean"},
    },
    "required": ["city", "population", "capital"],
    "additionalProperties": False,
}


def test_chat_response_format_json_schema(server, client):
    for seed in range(3):
        reply = client.chat.completions.create(
            model=server.model,
            messages=[{"role": "user", "content": "A city as JSON"}],
            seed=seed,
            temperature=1.0,
            max_tokens=300,
            response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA, "strict": True}},
        )
        choice = reply.choices[0]
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)


def test_streamed_constrained_chat_equals_the_whole_reply(server, client):
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}}
    args = dict(
        model=server.model,
        messages=[{"role": "user", "content": "JSON"}],
        seed=4,
        temperature=1.0,
        max_tokens=300,
        response_format=fmt,
    )
    stream = client.chat.completions.create(stream=True, **args)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text == client.chat.completions.create(**args).choices[0].message.content
    jsonschema.validate(json.loads(text), SCHEMA)


def test_chat_response_format_json_object(server, client):
    reply = client.chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": "Any JSON object"}],
        seed=1,
        temperature=1.0,
        max_tokens=1500,
        response_format={"type": "json_object"},
    )
    choice = reply.choices[0]
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(choice.message.content), dict)
    else:  # a random model may write one string past max_tokens: still an object's prefix
        assert choice.finish_reason == "length" and choice.message.content.startswith("{")


def test_native_regex_choices_and_schema(server):
    regex = r"[A-Z]{2}-[0-9]{3}"
    status, outs = server.request(
        "POST",
        "/generate",
        {
            "text": ["a", "b", "c"],
            "sampling_params": [
                {"regex": regex, "temperature": 1.0, "seed": 1},
                {"choices": ["left", "right"], "temperature": 1.0, "seed": 2},
                {"json_schema": json.dumps(SCHEMA), "temperature": 1.0, "seed": 3, "max_new_tokens": 300},
            ],
        },
    )
    assert status == 200
    assert re.fullmatch(regex, outs[0]["text"])
    assert outs[1]["text"] in ("left", "right")
    jsonschema.validate(json.loads(outs[2]["text"]), SCHEMA)


def test_unenforced_keywords_are_checked_and_reported(server):
    schema = {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 2, "maxItems": 2, "uniqueItems": True}
    seen = []
    for seed in range(6):
        status, out = server.request(
            "POST",
            "/generate",
            {"text": "x", "sampling_params": {"json_schema": schema, "temperature": 1.0, "seed": seed}},
        )
        assert status == 200
        check = out["meta_info"]["schema_check"]
        assert check["unenforced"] == ["uniqueItems"]
        items = json.loads(out["text"])
        assert check["valid"] == (len(set(items)) == 2)
        reason = out["meta_info"]["finish_reason"]
        assert reason["type"] == ("stop" if check["valid"] else "invalid"), reason  # never stop when invalid
        seen.append(check["valid"])
    assert any(seen) and not all(seen)


def test_a_constraint_that_fails_to_compile_is_a_400_on_both_apis_and_fails_fast_when_resent(launch):
    import time

    server = launch("--grammar-compile-timeout-s", "0.3")
    slow = "(?:[a-z0-9]{1,40}, ){1,60}"
    status, out = server.request("POST", "/generate", {"text": "a", "sampling_params": {"regex": slow}})
    assert status == 400 and "longer than 0.3 s" in out["error"]["message"]
    started = time.perf_counter()
    status, out = server.request("POST", "/v1/completions", {"model": server.model, "prompt": "a", "regex": slow})
    assert status == 400 and "longer than 0.3 s" in out["error"]["message"]
    assert time.perf_counter() - started < 0.3  # remembered: no worker is held for it again
    assert server.request("POST", "/generate", {"text": "a", "sampling_params": {"regex": "[0-9]{3}"}})[0] == 200


def test_a_backtracking_not_pattern_cannot_stall_the_server(server):
    import threading
    import time

    schema = {"type": "string", "pattern": "^a{26}$", "not": {"pattern": "^(a+)+b$"}}
    body = {"text": "a", "sampling_params": {"json_schema": schema, "max_new_tokens": 40}}
    result = {}
    worker = threading.Thread(target=lambda: result.update(out=server.request("POST", "/generate", body)))
    started = time.perf_counter()
    worker.start()
    slowest = 0.0
    while worker.is_alive() and time.perf_counter() - started < 60:
        t0 = time.perf_counter()
        assert server.request("GET", "/health", key=None)[0] == 200
        slowest = max(slowest, time.perf_counter() - t0)
    worker.join(60)
    status, out = result["out"]
    assert status == 200 and out["meta_info"]["schema_check"]["valid"] is True, out
    assert slowest < 0.5


def test_json_closes_within_max_tokens_and_a_too_small_budget_is_a_400(server):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["name", "tags"],
    }
    chat = {
        "model": server.model,
        "messages": [{"role": "user", "content": "JSON please"}],
        "temperature": 1.0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
    }
    for seed in range(4):
        status, out = server.request("POST", "/v1/chat/completions", {**chat, "max_tokens": 16, "seed": seed})
        assert status == 200, out
        assert set(json.loads(out["choices"][0]["message"]["content"])) == {"name", "tags"}
    status, out = server.request("POST", "/v1/chat/completions", {**chat, "max_tokens": 3})
    assert status == 400 and "needs at the least" in out["error"]["message"], out
    status, out = server.request(
        "POST",
        "/generate",
        {"text": "x", "sampling_params": {"json_object": True, "max_new_tokens": 6, "temperature": 1.0}},
    )
    assert status == 200 and isinstance(json.loads(out["text"]), dict), out


EBNF = 'root ::= answer (", " answer)*\nanswer ::= "yes" | "no" | "maybe " [0-9]'
EBNF_TEXT = re.compile(r"(yes|no|maybe [0-9])(, (yes|no|maybe [0-9]))*")
TAG_SCHEMA = {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["x"]}


def test_ebnf_on_every_api_through_the_default_backend(server, client):
    # The default (outlines) server hands EBNF to xgrammar.
    reply = client.chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": "Answer"}],
        seed=1,
        temperature=1.0,
        max_tokens=40,
        response_format={"type": "grammar", "grammar": EBNF},
    )
    assert EBNF_TEXT.fullmatch(reply.choices[0].message.content), reply.choices[0].message.content
    reply = client.completions.create(
        model=server.model, prompt="Answer:", seed=2, temperature=1.0, max_tokens=40, extra_body={"ebnf": EBNF}
    )
    assert EBNF_TEXT.fullmatch(reply.choices[0].text), reply.choices[0].text
    status, out = server.request(
        "POST",
        "/generate",
        {"text": "a", "sampling_params": {"ebnf": EBNF, "temperature": 1.0, "seed": 3, "max_new_tokens": 40}},
    )
    assert status == 200 and EBNF_TEXT.fullmatch(out["text"]), out


def test_structural_tag_response_format_with_the_openai_client(server, client):
    fmt = {
        "type": "structural_tag",
        "triggers": ["<fn="],
        "at_least_one": True,
        "structures": [{"begin": "<fn=get>", "schema": TAG_SCHEMA, "end": "</fn>"}],
    }
    for seed in range(3):
        reply = client.chat.completions.create(
            model=server.model,
            messages=[{"role": "user", "content": "Call it"}],
            seed=seed,
            temperature=1.0,
            max_tokens=40,
            response_format=fmt,
        )
        text = reply.choices[0].message.content
        found = re.match(r"<fn=get>(.*?)</fn>", text, re.S)  # at_least_one: the answer opens with a call
        assert found, text
        jsonschema.validate(json.loads(found.group(1)), TAG_SCHEMA)


def test_bad_grammars_are_400s_that_say_why(server):
    status, out = server.request(
        "POST", "/generate", {"text": "a", "sampling_params": {"ebnf": 'root ::= "a" missing'}}
    )
    assert status == 400 and "does not compile" in out["error"]["message"], out
    status, out = server.request(
        "POST",
        "/v1/chat/completions",
        {
            "model": server.model,
            "messages": [{"role": "user", "content": "x"}],
            "response_format": {
                "type": "structural_tag",
                "triggers": ["<a"],
                "structures": [{"begin": "<b>", "end": "</b>"}],
            },
        },
    )
    assert status == 400 and "starts with none of the triggers" in out["error"]["message"], out
    status, out = server.request(
        "POST", "/generate", {"text": "a", "sampling_params": {"ebnf": 'root ::= "a"', "regex": "a"}}
    )
    assert status == 400 and "at most one" in out["error"]["message"], out


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_each_grammar_backend_serves_json_ebnf_and_streams(launch, backend: str):
    import openai

    server = launch("--grammar-backend", backend)
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="-", max_retries=0)
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}}
    args = dict(
        model=server.model,
        messages=[{"role": "user", "content": "JSON"}],
        seed=4,
        temperature=1.0,
        max_tokens=200,
        response_format=fmt,
    )
    whole = client.chat.completions.create(**args).choices[0]
    stream = client.chat.completions.create(stream=True, **args)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == whole.message.content
    if whole.finish_reason == "stop":  # no budget-aware closing off outlines: a long string may hit max_tokens
        jsonschema.validate(json.loads(whole.message.content), SCHEMA)
    status, out = server.request(
        "POST",
        "/generate",
        {"text": "a", "sampling_params": {"ebnf": EBNF, "temperature": 1.0, "seed": 3, "max_new_tokens": 40}},
    )
    assert status == 200 and EBNF_TEXT.fullmatch(out["text"]), out
    status, out = server.request(
        "POST",
        "/generate",
        {
            "text": "a",
            "sampling_params": {"json_schema": {"type": "integer", "minimum": 5, "maximum": 7}, "temperature": 1.0},
        },
    )
    assert status == 200 and int(out["text"]) in (5, 6, 7), out
    assert out["meta_info"]["schema_check"]["valid"] is True


def test_a_stream_whose_constraint_fails_to_compile_is_a_400_not_a_200_stream(server, client):
    import openai

    bad = 'root ::= "a" missing'
    for path, body in [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
        ("/v1/completions", {"prompt": "x"}),
    ]:
        status, out = server.request("POST", path, {"model": server.model, "stream": True, "ebnf": bad, **body})
        assert status == 400 and "does not compile" in out["error"]["message"], (path, status, out)
    status, out = server.request("POST", "/generate", {"text": "x", "stream": True, "sampling_params": {"ebnf": bad}})
    assert status == 400 and "does not compile" in out["error"]["message"], out
    try:
        client.chat.completions.create(
            model=server.model, messages=[{"role": "user", "content": "x"}], stream=True, extra_body={"ebnf": bad}
        )
        raise AssertionError("expected a 400")
    except openai.BadRequestError as exc:
        assert "does not compile" in str(exc)


AMBIGUOUS = 'root ::= x*\nx ::= "a" | "a" "a" | x x | "b" x "b"'  # Earley work grows with the output


def test_a_grammar_too_slow_to_follow_ends_its_request_not_the_batch(launch):
    server = launch("--grammar-backend", "xgrammar", "--grammar-max-mask-ms", "5")
    status, out = server.request(
        "POST",
        "/generate",
        {
            "text": "x",
            "sampling_params": {
                "ebnf": AMBIGUOUS,
                "max_new_tokens": 600,
                "min_new_tokens": 600,
                "temperature": 1.0,
                "seed": 1,
            },
        },
    )
    assert status == 400 and "longer than 5 ms to write one step's token mask" in out["error"]["message"], out
    status, out = server.request(
        "POST", "/generate", {"text": "x", "sampling_params": {"regex": "[0-9]{3}", "temperature": 1.0}}
    )
    assert status == 200 and re.fullmatch("[0-9]{3}", out["text"]), out


def test_ignore_eos_still_ends_a_constrained_output_where_its_grammar_does(server):
    for seed in range(8):
        status, out = server.request(
            "POST",
            "/generate",
            {
                "text": "x",
                "sampling_params": {
                    "regex": "[ab]{1,3}",
                    "ignore_eos": True,
                    "temperature": 1.0,
                    "seed": seed,
                    "max_new_tokens": 8,
                },
            },
        )
        assert status == 200 and re.fullmatch("[ab]{1,3}", out["text"]), out
