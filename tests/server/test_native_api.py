"""The SGLang-native API (/generate and friends), bad inputs, and disconnecting clients."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

GREEDY = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}


def test_batch_of_text_and_of_input_ids(server):
    status, outs = server.request("POST", "/generate", {"text": ["Hello", "World"], "sampling_params": GREEDY})
    assert status == 200 and len(outs) == 2 and all(len(o["output_ids"]) == 12 for o in outs)
    status, by_ids = server.request("POST", "/generate", {"input_ids": [[15496], [10603]], "sampling_params": GREEDY})
    assert status == 200 and [o["output_ids"] for o in by_ids] == [o["output_ids"] for o in outs]
    status, one = server.request("POST", "/generate", {"input_ids": [15496], "sampling_params": GREEDY})
    assert isinstance(one, dict) and one["output_ids"] == outs[0]["output_ids"]
    assert one["meta_info"]["finish_reason"] == {"type": "length", "length": 12}


def test_prefill_only_request_returns_prompt_logprobs(server):
    body = {"input_ids": list(range(100, 130)), "sampling_params": {"max_new_tokens": 0}, "return_logprob": True,
            "logprob_start_len": 10, "top_logprobs_num": 2, "return_text_in_logprobs": True}
    status, out = server.request("POST", "/generate", body)
    assert status == 200 and out["output_ids"] == [] and out["text"] == ""
    entries = out["meta_info"]["input_token_logprobs"]
    assert [e[1] for e in entries] == list(range(110, 130)) and all(e[0] <= 0 for e in entries)
    assert all(isinstance(e[2], str) for e in entries)
    assert len(out["meta_info"]["input_top_logprobs"]) == 20
    body["logprob_start_len"] = 0
    first = server.request("POST", "/generate", body)[1]["meta_info"]["input_token_logprobs"][0]
    assert first[0] is None and first[1] == 100


def test_sse_framing_and_streamed_text_equals_greedy(server):
    body = {"text": "The radix tree", "sampling_params": GREEDY}
    full = server.request("POST", "/generate", body)[1]
    events = server.sse("/generate", {**body, "stream": True})
    assert events[-1] == "[DONE]"
    parsed = [json.loads(e) for e in events[:-1]]
    assert all(parsed[i]["text"].startswith(parsed[i - 1]["text"]) for i in range(1, len(parsed)))
    assert parsed[-1]["text"] == full["text"] and parsed[-1]["output_ids"] == full["output_ids"]
    assert parsed[-1]["meta_info"]["finish_reason"] == full["meta_info"]["finish_reason"]


def test_utility_routes(server):
    status, info = server.request("GET", "/get_model_info")
    assert status == 200 and info["model_path"].endswith(server.model) and info["context_length"] == 2048
    assert server.request("POST", "/flush_cache")[0] == 200
    assert server.request("POST", "/abort_request", {"rid": "no-such-request"})[0] == 200
    status, text = server.request("GET", "/metrics")
    assert status == 200 and "arbor_time_to_first_token_seconds_bucket" in text
    assert "arbor_cache_hit_rate" in text and "arbor_num_running_requests" in text


LONG = "x" * 300_000
BAD_INPUTS = [
    # (description, method, path, body or raw bytes, status, message fragment)
    ("malformed JSON", "POST", "/generate", b"{not json", 400, "not valid JSON"),
    ("body not an object", "POST", "/generate", b"[1, 2]", 400, "invalid request"),
    ("unknown top-level field", "POST", "/generate", {"text": "a", "frobnicate": 1}, 400, "frobnicate"),
    ("text of wrong type", "POST", "/generate", {"text": 5}, 400, "invalid request"),
    ("neither text nor input_ids", "POST", "/generate", {"sampling_params": {}}, 400, "exactly one of"),
    ("both text and input_ids", "POST", "/generate", {"text": "a", "input_ids": [1]}, 400, "exactly one of"),
    ("empty input_ids", "POST", "/generate", {"input_ids": []}, 400, "empty"),
    ("token id out of vocabulary", "POST", "/generate", {"input_ids": [1, 60000]}, 400, "outside the vocabulary"),
    ("token ids not integers", "POST", "/generate", {"input_ids": ["a"]}, 400, "input_ids"),
    ("negative max_new_tokens", "POST", "/generate", {"text": "a", "sampling_params": {"max_new_tokens": -1}},
     400, "max_new_tokens must be"),
    ("huge max_new_tokens", "POST", "/generate", {"text": "a", "sampling_params": {"max_new_tokens": 10**9}},
     400, "context length is 2048"),
    ("unknown sampling parameter", "POST", "/generate", {"text": "a", "sampling_params": {"temp": 0}},
     400, "unknown sampling parameter"),
    ("negative temperature", "POST", "/generate", {"text": "a", "sampling_params": {"temperature": -1}},
     400, "temperature"),
    ("top_p of zero", "POST", "/generate", {"text": "a", "sampling_params": {"top_p": 0}}, 400, "top_p"),
    ("huge n", "POST", "/generate", {"text": "a", "sampling_params": {"n": 1000}}, 400, "n must be"),
    ("prompt over the context", "POST", "/generate", {"input_ids": [1] * 2100}, 400, "context length"),
    ("bad logprob_start_len", "POST", "/generate", {"text": "a", "return_logprob": True, "logprob_start_len": 99},
     400, "logprob_start_len"),
    ("too many top logprobs", "POST", "/generate", {"text": "a", "return_logprob": True, "top_logprobs_num": 500},
     400, "top_logprobs_num"),
    ("sampling_params count mismatch", "POST", "/generate",
     {"text": ["a", "b"], "sampling_params": [{}]}, 400, "2 prompts"),
    ("stream of a batch", "POST", "/generate", {"text": ["a", "b"], "stream": True}, 400, "single prompt"),
    ("empty stop string", "POST", "/generate", {"text": "a", "sampling_params": {"stop": [""]}}, 400, "stop must"),
    ("oversize body", "POST", "/generate", {"text": LONG}, 413, "limit"),
    ("unknown model", "POST", "/v1/completions", {"model": "gpt-9", "prompt": "a"}, 404, "does not exist"),
    # more types, ranges and shapes
    ("text list with a number", "POST", "/generate", {"text": ["a", 5]}, 400, "invalid request"),
    ("input_ids batch with an empty prompt", "POST", "/generate", {"input_ids": [[1, 2], []]}, 400, "empty"),
    ("input_ids nested too deep", "POST", "/generate", {"input_ids": [[[1]]]}, 400, "input_ids"),
    ("boolean token id", "POST", "/generate", {"input_ids": [True, 2]}, 400, "input_ids"),
    ("sampling_params a list for one prompt", "POST", "/generate", {"text": "a", "sampling_params": [{}, {}]},
     400, "2 entries for 1 prompts"),
    ("sampling_params a string", "POST", "/generate", {"text": "a", "sampling_params": "greedy"}, 400,
     "invalid request"),
    ("max_new_tokens a string", "POST", "/generate", {"text": "a", "sampling_params": {"max_new_tokens": "8"}},
     400, "max_new_tokens must be"),
    ("max_new_tokens a float", "POST", "/generate", {"text": "a", "sampling_params": {"max_new_tokens": 8.5}},
     400, "max_new_tokens must be"),
    ("top_p above one", "POST", "/generate", {"text": "a", "sampling_params": {"top_p": 1.5}}, 400, "top_p"),
    ("min_p negative", "POST", "/generate", {"text": "a", "sampling_params": {"min_p": -0.1}}, 400, "min_p"),
    ("frequency penalty too big", "POST", "/generate", {"text": "a", "sampling_params": {"frequency_penalty": 3}},
     400, "frequency_penalty"),
    ("repetition penalty zero", "POST", "/generate", {"text": "a", "sampling_params": {"repetition_penalty": 0}},
     400, "repetition_penalty"),
    ("min_new_tokens negative", "POST", "/generate", {"text": "a", "sampling_params": {"min_new_tokens": -2}},
     400, "min_new_tokens"),
    ("ignore_eos not a boolean", "POST", "/generate", {"text": "a", "sampling_params": {"ignore_eos": "yes"}},
     400, "ignore_eos"),
    ("n of zero", "POST", "/generate", {"text": "a", "sampling_params": {"n": 0}}, 400, "n must be"),
    ("stop of a number", "POST", "/generate", {"text": "a", "sampling_params": {"stop": 5}}, 400, "stop must"),
    ("too many stop strings", "POST", "/generate", {"text": "a", "sampling_params": {"stop": ["x"] * 40}}, 400,
     "at most 16"),
    ("too many stop token ids", "POST", "/generate",
     {"text": "a", "sampling_params": {"stop_token_ids": list(range(300))}}, 400, "at most 256"),
    ("stream_interval of zero", "POST", "/generate", {"text": "a", "sampling_params": {"stream_interval": 0}},
     400, "stream_interval"),
    ("no_stop_trim not a boolean", "POST", "/generate", {"text": "a", "sampling_params": {"no_stop_trim": 1}},
     400, "no_stop_trim"),
    ("negative top_logprobs_num", "POST", "/generate", {"text": "a", "return_logprob": True, "top_logprobs_num": -1},
     400, "top_logprobs_num"),
    ("logprob_start_len below -1", "POST", "/generate", {"text": "a", "return_logprob": True, "logprob_start_len": -5},
     400, "logprob_start_len"),
    ("rid list for one prompt too long", "POST", "/generate", {"text": "a", "rid": ["x", "y"]}, 400, "rid"),
    ("a single rid for a batch", "POST", "/generate", {"text": ["a", "b"], "rid": "x"}, 400, "rid"),
    ("cache_salt too long", "POST", "/generate", {"text": "a", "cache_salt": "s" * 300}, 400, "cache_salt"),
    ("extra_key differing in a batch", "POST", "/generate", {"text": ["a", "b"], "extra_key": ["k1", "k2"]}, 400,
     "extra_key"),
    ("generate for another model", "POST", "/generate", {"text": "a", "model": "gpt-9"}, 404, "does not exist"),
    ("json_schema of a number", "POST", "/generate", {"text": "a", "sampling_params": {"json_schema": 5}}, 400,
     "json_schema"),
    ("empty choices", "POST", "/generate", {"text": "a", "sampling_params": {"choices": []}}, 400, "non-empty"),
    ("json_object false", "POST", "/generate", {"text": "a", "sampling_params": {"json_object": False}}, 400,
     "json_object"),
    ("abort without rid", "POST", "/abort_request", {}, 400, "rid"),
    ("completion prompt of mixed types", "POST", "/v1/completions", {"model": "MODEL", "prompt": ["a", [1]]}, 400,
     "prompt"),
    ("completion empty prompt list", "POST", "/v1/completions", {"model": "MODEL", "prompt": []}, 400, "prompt"),
    ("completion echo", "POST", "/v1/completions", {"model": "MODEL", "prompt": "a", "echo": True}, 400, "echo"),
    ("completion best_of", "POST", "/v1/completions", {"model": "MODEL", "prompt": "a", "best_of": 3}, 400,
     "best_of is not supported"),
    ("completion unknown field", "POST", "/v1/completions", {"model": "MODEL", "prompt": "a", "temprature": 0}, 400,
     "temprature"),
    ("chat content parts with an image", "POST", "/v1/chat/completions", {"model": "MODEL", "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400, "text content"),
    ("chat n too big", "POST", "/v1/chat/completions",
     {"model": "MODEL", "messages": [{"role": "user", "content": "a"}], "n": 500}, 400, "n must be"),
    ("chat logit_bias", "POST", "/v1/chat/completions",
     {"model": "MODEL", "messages": [{"role": "user", "content": "a"}], "logit_bias": {"5": 1}}, 400,
     "logit_bias is not supported"),
    ("chat response_format of an unknown type", "POST", "/v1/chat/completions",
     {"model": "MODEL", "messages": [{"role": "user", "content": "a"}], "response_format": {"type": "xml"}}, 400,
     "invalid request"),
    ("chat for another model", "POST", "/v1/chat/completions",
     {"model": "gpt-9", "messages": [{"role": "user", "content": "a"}]}, 404, "does not exist"),
    ("unsupported field set", "POST", "/generate", {"text": "a", "lora_path": "adapter"}, 400,
     "lora_path is not supported"),
    ("custom logit processor", "POST", "/generate", {"text": "a", "custom_logit_processor": "x"}, 400,
     "never runs code"),
    ("unsupported sampling field set", "POST", "/generate", {"text": "a", "sampling_params": {"ebnf": "root"}},
     400, "ebnf is not supported"),
    ("top_k beyond int64", "POST", "/generate", {"text": "a", "sampling_params": {"top_k": 2**63}}, 400, "top_k"),
    ("infinite temperature", "POST", "/generate", b'{"text": "a", "sampling_params": {"temperature": 1e400}}', 400,
     "out of range"),
    ("seed beyond int64", "POST", "/generate", {"text": "a", "sampling_params": {"seed": 2**64}}, 400, "seed"),
    ("stop token outside the vocabulary", "POST", "/v1/completions",
     {"model": "MODEL", "prompt": "a", "min_tokens": 1, "stop_token_ids": [60000]}, 400, "outside the vocabulary"),
    ("negative stop token", "POST", "/generate", {"text": "a", "sampling_params": {"stop_token_ids": [-1]}}, 400,
     "stop_token_ids"),
    ("repeated rid in a batch", "POST", "/generate", {"text": ["a", "b"], "rid": ["same", "same"]}, 400,
     "appears twice"),
    ("invalid stop_regex", "POST", "/generate", {"text": "a", "sampling_params": {"stop_regex": "(a"}}, 400,
     "stop_regex"),
    ("unsupported OpenAI field set", "POST", "/v1/chat/completions",
     {"model": "MODEL", "messages": [{"role": "user", "content": "a"}], "tools": [{"type": "function"}]}, 400,
     "tools is not supported"),
    ("tool_choice without tools", "POST", "/v1/chat/completions",
     {"model": "MODEL", "messages": [{"role": "user", "content": "a"}], "tool_choice": "required"}, 400,
     "tool_choice"),
    ("zero max_tokens", "POST", "/v1/chat/completions",
     {"model": "MODEL", "messages": [{"role": "user", "content": "a"}], "max_tokens": 0}, 400, "max_tokens"),
    ("bad role", "POST", "/v1/chat/completions",
     {"model": "MODEL", "messages": [{"role": "robot", "content": "a"}]}, 400, "role"),
    ("empty messages", "POST", "/v1/chat/completions", {"model": "MODEL", "messages": []}, 400, "messages"),
    ("completion logprobs too big", "POST", "/v1/completions",
     {"model": "MODEL", "prompt": "a", "logprobs": 50}, 400, "logprobs"),
    ("top_logprobs without logprobs", "POST", "/v1/chat/completions",
     {"model": "MODEL", "messages": [{"role": "user", "content": "a"}], "top_logprobs": 2}, 400, "top_logprobs"),
    ("json_schema without a schema", "POST", "/v1/chat/completions",
     {"model": "MODEL", "messages": [{"role": "user", "content": "a"}],
      "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, 400, "json_schema.schema"),
    ("unsatisfiable json_schema", "POST", "/v1/chat/completions",
     {"model": "MODEL", "messages": [{"role": "user", "content": "a"}],
      "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
          "type": "integer", "minimum": 3, "maximum": 1}}}}, 400, "minimum 3 is above maximum 1"),
    ("invalid regex", "POST", "/generate", {"text": "a", "sampling_params": {"regex": "(ab"}}, 400, "regex"),
    ("two constraints", "POST", "/generate", {"text": "a", "sampling_params": {"regex": "a", "choices": ["a"]}},
     400, "at most one"),
    ("non-local $ref", "POST", "/generate",
     {"text": "a", "sampling_params": {"json_schema": {"$ref": "http://x/y.json"}}}, 400, "not local"),
    ("unknown route", "GET", "/v2/everything", None, 404, "no route"),
]


@pytest.mark.parametrize("case", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_gets_a_clear_4xx(server, case):
    _, method, path, body, status, fragment = case
    if isinstance(body, dict):
        body = json.loads(json.dumps(body).replace("MODEL", server.model))
    raw = body if isinstance(body, bytes) else None
    got, payload = server.request(method, path, None if raw else body, raw=raw)
    assert got == status, payload
    error = payload["error"]
    assert fragment in error["message"] and error["code"] == status
    ok, out = server.request("POST", "/generate", {"text": "still up", "sampling_params": {"max_new_tokens": 2}})
    assert ok == 200 and out["meta_info"]["completion_tokens"] <= 2
    assert server.request("GET", "/get_server_info")[1]["stats"]["invariant_ok"] == 1.0


def test_missing_api_key_is_401_but_health_is_open(server):
    status, payload = server.request("POST", "/generate", {"text": "a"}, key=None)
    assert status == 401 and "API key" in payload["error"]["message"]
    assert server.request("GET", "/health", key=None)[0] == 200


async def _stream_client(server, body: dict, leave_after: int | None) -> int:
    """POST a streaming /generate; read events (or leave after `leave_after`); return events read."""
    reader, writer = await asyncio.open_connection(server.host, server.port)
    data = json.dumps(body).encode()
    writer.write(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Authorization: Bearer {server.key}\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
    await writer.drain()
    events = 0
    while True:
        line = await reader.readline()
        if not line:
            break
        if line.startswith(b"data: "):
            if line.strip() == b"data: [DONE]":
                break
            events += 1
            if leave_after is not None and events >= leave_after:
                break
    writer.close()
    return events


def test_64_streams_with_20_disconnects(server):
    body = {"text": "Concurrent streaming", "stream": True,
            "sampling_params": {"max_new_tokens": 48, "temperature": 0, "ignore_eos": True}}

    async def run() -> list[int]:
        return await asyncio.gather(*(
            _stream_client(server, {**body, "sampling_params": {**body["sampling_params"], "max_new_tokens": 400}}, 3)
            if i % 16 < 5 else _stream_client(server, body, None)
            for i in range(64)
        ))

    counts = asyncio.run(run())
    left = [c for i, c in enumerate(counts) if i % 16 < 5]
    stayed = [c for i, c in enumerate(counts) if i % 16 >= 5]
    assert len(left) == 20 and all(c == 3 for c in left)
    assert len(stayed) == 44 and all(c >= 1 for c in stayed)
    stats = _idle_stats(server)
    assert stats["invariant_ok"] == 1.0
    assert stats["free_slots"] + stats["cache_tokens"] == stats["total_slots"]  # no slot leaked


def _idle_stats(server, timeout_s: float = 30.0) -> dict:
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        stats = server.request("GET", "/get_server_info")[1]["stats"]
        if (stats["running"] == 0 and stats["waiting"] == 0) or time.monotonic() > deadline:
            return stats
        time.sleep(0.2)


def test_every_sglang_field_at_its_default_is_accepted(server):
    import msgspec

    from arbor.runtime.server.protocol import GenerateRequest

    body = {f.name: f.default for f in msgspec.structs.fields(GenerateRequest)
            if f.default is not msgspec.NODEFAULT and f.name not in ("model", "input_ids")}
    body.update(text="Hello", sampling_params={"max_new_tokens": 2, "skip_special_tokens": True,
                                                "spaces_between_special_tokens": True, "no_stop_trim": False,
                                                "stream_interval": None, "logit_bias": None, "ebnf": None})
    status, out = server.request("POST", "/generate", body)
    assert status == 200, out
    assert out["meta_info"]["completion_tokens"] == 2


def test_stream_interval_batches_stream_events(server):
    body = {"text": "Hi", "stream": True, "sampling_params": {"max_new_tokens": 9, "stream_interval": 4,
                                                              "ignore_eos": True}}
    events = [json.loads(e) for e in server.sse("/generate", body)[:-1]]
    assert [e["meta_info"]["completion_tokens"] for e in events] == [4, 8, 9]


def test_sampling_seed_is_seed_and_extra_key_separates_caches(server):
    def gen(params: dict, **extra) -> dict:
        return server.request("POST", "/generate", {"text": "Seeded prompt for the cache", **extra,
                                                    "sampling_params": {"max_new_tokens": 6, **params}})[1]

    assert gen({"sampling_seed": 7})["output_ids"] == gen({"seed": 7})["output_ids"]
    assert gen({}, extra_key="tenant-a")["meta_info"]["cached_tokens"] == 0
    assert gen({}, extra_key="tenant-a")["meta_info"]["cached_tokens"] > 0
    assert gen({}, extra_key="tenant-b")["meta_info"]["cached_tokens"] == 0


def test_cache_hit_rate_counts_admitted_requests_only(launch):
    server = launch()
    for start in (100, 5000, 9000):
        server.request("POST", "/generate", {"input_ids": list(range(start, start + 64)),
                                             "sampling_params": {"max_new_tokens": 4}})
    assert server.request("GET", "/get_server_info")[1]["stats"]["cache_hit_rate"] == 0.0
    server.request("POST", "/generate", {"input_ids": list(range(100, 164)), "sampling_params": {"max_new_tokens": 4}})
    assert server.request("GET", "/get_server_info")[1]["stats"]["cache_hit_rate"] == 63 / 256


def test_huge_top_k_means_no_top_k_and_the_server_keeps_serving(server):
    status, out = server.request("POST", "/generate", {"text": "a", "sampling_params": {
        "top_k": 2**62, "max_new_tokens": 3, "temperature": 1e-7}})
    assert status == 200 and out["meta_info"]["completion_tokens"] == 3, out
    assert server.request("GET", "/health", key=None)[0] == 200


def test_a_prompt_that_cannot_fit_is_refused_before_tokenizing(launch):
    server = launch("--context-length", "64")
    started = time.perf_counter()
    status, out = server.request("POST", "/generate", {"text": "word " * 200_000})
    assert status == 400 and "cannot fit the context length of 64 tokens" in out["error"]["message"]
    assert time.perf_counter() - started < 5
    status, out = server.request("POST", "/v1/chat/completions", {"model": server.model, "messages": [
        {"role": "user", "content": "word " * 200_000}]})
    assert status == 400 and "cannot fit" in out["error"]["message"]


def test_a_rid_in_flight_cannot_be_taken_by_another_request(server):
    async def scenario() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        first = loop.run_in_executor(None, lambda: server.request("POST", "/generate", {
            "text": "a", "rid": "owned-rid", "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}}))
        await asyncio.sleep(0.5)
        second = server.request("POST", "/generate", {"text": "b", "rid": "owned-rid"})
        return (await first)[0], second

    first_status, (second_status, body) = asyncio.run(scenario())
    assert first_status == 200 and second_status == 400 and "already in use" in body["error"]["message"]


def _logprob_stream(server, **params) -> list[dict]:
    body = {"text": "Hi", "stream": True, "return_logprob": True, "top_logprobs_num": 2,
            "sampling_params": {"max_new_tokens": 6, "ignore_eos": True, "temperature": 0, **params}}
    return [json.loads(e) for e in server.sse("/generate", body)[:-1]]


def test_native_streams_are_cumulative_by_default_and_incremental_with_the_flag(server, launch):
    cumulative = _logprob_stream(server)
    for event in cumulative:
        meta = event["meta_info"]
        assert len(meta["output_token_logprobs"]) == len(event["output_ids"]) == meta["completion_tokens"]
        assert len(meta["output_top_logprobs"]) == meta["completion_tokens"]
    incremental = _logprob_stream(launch("--incremental-streaming-output"))
    assert "".join(e["text"] for e in incremental) == cumulative[-1]["text"]
    assert [t for e in incremental for t in e["output_ids"]] == cumulative[-1]["output_ids"]
    entries = [x for e in incremental for x in e["meta_info"]["output_token_logprobs"]]
    assert entries == cumulative[-1]["meta_info"]["output_token_logprobs"]


def test_a_cumulative_stream_too_heavy_in_logprobs_is_refused_with_the_way_out(server):
    body = {"text": "Hi", "stream": True, "return_logprob": True, "top_logprobs_num": 20,
            "sampling_params": {"max_new_tokens": 1000}}
    status, out = server.request("POST", "/generate", body)
    assert status == 400 and "--incremental-streaming-output" in out["error"]["message"]
    assert len(server.sse("/generate", {**body, "sampling_params": {"max_new_tokens": 8, "stream_interval": 4}})) > 1


def test_docs_list_every_bad_input_case():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "server.md").read_text()
    assert [c[0] for c in BAD_INPUTS if f"| {c[0]} |" not in doc] == []
