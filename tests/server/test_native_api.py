"""The SGLang-native API (/generate and friends) and disconnecting clients."""

from __future__ import annotations

import asyncio
import json
import time

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
    body = {
        "input_ids": list(range(100, 130)),
        "sampling_params": {"max_new_tokens": 0},
        "return_logprob": True,
        "logprob_start_len": 10,
        "top_logprobs_num": 2,
        "return_text_in_logprobs": True,
    }
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


def test_missing_api_key_is_401_but_health_is_open(server):
    status, payload = server.request("POST", "/generate", {"text": "a"}, key=None)
    assert status == 401 and "API key" in payload["error"]["message"]
    assert server.request("GET", "/health", key=None)[0] == 200


async def _stream_client(server, body: dict, leave_after: int | None) -> int:
    """POST a streaming /generate; read events (or leave after `leave_after`); return events read."""
    reader, writer = await asyncio.open_connection(server.host, server.port)
    data = json.dumps(body).encode()
    writer.write(
        b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {server.key}\r\nContent-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
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
    body = {
        "text": "Concurrent streaming",
        "stream": True,
        "sampling_params": {"max_new_tokens": 48, "temperature": 0, "ignore_eos": True},
    }

    async def run() -> list[int]:
        return await asyncio.gather(
            *(
                _stream_client(
                    server, {**body, "sampling_params": {**body["sampling_params"], "max_new_tokens": 400}}, 3
                )
                if i % 16 < 5
                else _stream_client(server, body, None)
                for i in range(64)
            )
        )

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

    body = {
        f.name: f.default
        for f in msgspec.structs.fields(GenerateRequest)
        if f.default is not msgspec.NODEFAULT and f.name not in ("model", "input_ids")
    }
    body.update(
        text="Hello",
        sampling_params={
            "max_new_tokens": 2,
            "skip_special_tokens": True,
            "spaces_between_special_tokens": True,
            "no_stop_trim": False,
            "stream_interval": None,
            "logit_bias": None,
            "ebnf": None,
        },
    )
    status, out = server.request("POST", "/generate", body)
    assert status == 200, out
    assert out["meta_info"]["completion_tokens"] == 2


def test_stream_interval_batches_stream_events(server):
    body = {
        "text": "Hi",
        "stream": True,
        "sampling_params": {"max_new_tokens": 9, "stream_interval": 4, "ignore_eos": True},
    }
    events = [json.loads(e) for e in server.sse("/generate", body)[:-1]]
    assert [e["meta_info"]["completion_tokens"] for e in events] == [4, 8, 9]


def test_sampling_seed_is_seed_and_extra_key_separates_caches(server):
    def gen(params: dict, **extra) -> dict:
        return server.request(
            "POST",
            "/generate",
            {"text": "Seeded prompt for the cache", **extra, "sampling_params": {"max_new_tokens": 6, **params}},
        )[1]

    assert gen({"sampling_seed": 7})["output_ids"] == gen({"seed": 7})["output_ids"]
    assert gen({}, extra_key="tenant-a")["meta_info"]["cached_tokens"] == 0
    assert gen({}, extra_key="tenant-a")["meta_info"]["cached_tokens"] > 0
    assert gen({}, extra_key="tenant-b")["meta_info"]["cached_tokens"] == 0


def test_cache_hit_rate_counts_admitted_requests_only(launch):
    server = launch()
    for start in (100, 5000, 9000):
        server.request(
            "POST", "/generate", {"input_ids": list(range(start, start + 64)), "sampling_params": {"max_new_tokens": 4}}
        )
    assert server.request("GET", "/get_server_info")[1]["stats"]["cache_hit_rate"] == 0.0
    server.request("POST", "/generate", {"input_ids": list(range(100, 164)), "sampling_params": {"max_new_tokens": 4}})
    assert server.request("GET", "/get_server_info")[1]["stats"]["cache_hit_rate"] == 63 / 256


def test_huge_top_k_means_no_top_k_and_the_server_keeps_serving(server):
    status, out = server.request(
        "POST",
        "/generate",
        {"text": "a", "sampling_params": {"top_k": 2**62, "max_new_tokens": 3, "temperature": 1e-7}},
    )
    assert status == 200 and out["meta_info"]["completion_tokens"] == 3, out
    assert server.request("GET", "/health", key=None)[0] == 200


def test_a_prompt_that_cannot_fit_is_refused_before_tokenizing(launch):
    server = launch("--context-length", "64")
    started = time.perf_counter()
    status, out = server.request("POST", "/generate", {"text": "word " * 200_000})
    assert status == 400 and "cannot fit the context length of 64 tokens" in out["error"]["message"]
    assert time.perf_counter() - started < 5
    status, out = server.request(
        "POST",
        "/v1/chat/completions",
        {"model": server.model, "messages": [{"role": "user", "content": "word " * 200_000}]},
    )
    assert status == 400 and "cannot fit" in out["error"]["message"]


def test_a_rid_in_flight_cannot_be_taken_by_another_request(server):
    async def scenario() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        first = loop.run_in_executor(
            None,
            lambda: server.request(
                "POST",
                "/generate",
                {"text": "a", "rid": "owned-rid", "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}},
            ),
        )
        await asyncio.sleep(0.5)
        second = server.request("POST", "/generate", {"text": "b", "rid": "owned-rid"})
        return (await first)[0], second

    first_status, (second_status, body) = asyncio.run(scenario())
    assert first_status == 200 and second_status == 400 and "already in use" in body["error"]["message"]


def _logprob_stream(server, **params) -> list[dict]:
    body = {
        "text": "Hi",
        "stream": True,
        "return_logprob": True,
        "top_logprobs_num": 2,
        "sampling_params": {"max_new_tokens": 6, "ignore_eos": True, "temperature": 0, **params},
    }
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
    body = {
        "text": "Hi",
        "stream": True,
        "return_logprob": True,
        "top_logprobs_num": 20,
        "sampling_params": {"max_new_tokens": 1000},
    }
    status, out = server.request("POST", "/generate", body)
    assert status == 400 and "--incremental-streaming-output" in out["error"]["message"]
    assert len(server.sse("/generate", {**body, "sampling_params": {"max_new_tokens": 8, "stream_interval": 4}})) > 1
