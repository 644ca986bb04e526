"""Bad inputs against a live server with two tenants: each of tenant A's bad requests gets its
4xx with a message that says what to change (or a clean result), and afterwards the server
is healthy, the KV invariant holds and tenant B's normal request completes within 2 s.
docs/server.md lists every case."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from tests.server.conftest import Server, start_server, stop_server

TENANT_A, TENANT_B, ADMIN = "tenant-a-key", "tenant-b-key", "admin-key"

LONG = "x" * 300_000
DEEP = 5000  # far past Python's recursion limit: every parser that recursed would fail


def _deep(opener: str, leaf: str, closer: str) -> str:
    return opener * DEEP + leaf + closer * DEEP


DEEP_ARRAY = _deep("[", '"x"', "]")
DEEP_SCHEMA = _deep('{"type": "array", "items": ', '{"type": "integer"}', "}")
DEEP_GROUPS = _deep("(", "a", ")")
CHAT = '"messages": [{"role": "user", "content": "a"}]'


def _tool(params: dict, choice: object = "required") -> dict:
    return {
        "model": "MODEL",
        "messages": [{"role": "user", "content": "a"}],
        "tool_choice": choice,
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", **params}}}],
    }


NAMED = {"type": "function", "function": {"name": "f"}}
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
    (
        "negative max_new_tokens",
        "POST",
        "/generate",
        {"text": "a", "sampling_params": {"max_new_tokens": -1}},
        400,
        "max_new_tokens must be",
    ),
    (
        "huge max_new_tokens",
        "POST",
        "/generate",
        {"text": "a", "sampling_params": {"max_new_tokens": 10**9}},
        400,
        "context length is 2048",
    ),
    (
        "unknown sampling parameter",
        "POST",
        "/generate",
        {"text": "a", "sampling_params": {"temp": 0}},
        400,
        "unknown sampling parameter",
    ),
    (
        "negative temperature",
        "POST",
        "/generate",
        {"text": "a", "sampling_params": {"temperature": -1}},
        400,
        "temperature",
    ),
    ("top_p of zero", "POST", "/generate", {"text": "a", "sampling_params": {"top_p": 0}}, 400, "top_p"),
    ("huge n", "POST", "/generate", {"text": "a", "sampling_params": {"n": 1000}}, 400, "n must be"),
    ("prompt over the context", "POST", "/generate", {"input_ids": [1] * 2100}, 400, "context length"),
    (
        "bad logprob_start_len",
        "POST",
        "/generate",
        {"text": "a", "return_logprob": True, "logprob_start_len": 99},
        400,
        "logprob_start_len",
    ),
    (
        "too many top logprobs",
        "POST",
        "/generate",
        {"text": "a", "return_logprob": True, "top_logprobs_num": 500},
        400,
        "top_logprobs_num",
    ),
    (
        "sampling_params count mismatch",
        "POST",
        "/generate",
        {"text": ["a", "b"], "sampling_params": [{}]},
        400,
        "2 prompts",
    ),
    ("stream of a batch", "POST", "/generate", {"text": ["a", "b"], "stream": True}, 400, "single prompt"),
    ("empty stop string", "POST", "/generate", {"text": "a", "sampling_params": {"stop": [""]}}, 400, "stop must"),
    ("oversize body", "POST", "/generate", {"text": LONG}, 413, "limit"),
    ("unknown model", "POST", "/v1/completions", {"model": "gpt-9", "prompt": "a"}, 404, "does not exist"),
    # more types, ranges and shapes
    ("text list with a number", "POST", "/generate", {"text": ["a", 5]}, 400, "invalid request"),
    ("input_ids batch with an empty prompt", "POST", "/generate", {"input_ids": [[1, 2], []]}, 400, "empty"),
    ("input_ids nested too deep", "POST", "/generate", {"input_ids": [[[1]]]}, 400, "input_ids"),
    ("boolean token id", "POST", "/generate", {"input_ids": [True, 2]}, 400, "input_ids"),
    (
        "sampling_params a list for one prompt",
        "POST",
        "/generate",
        {"text": "a", "sampling_params": [{}, {}]},
        400,
        "2 entries for 1 prompts",
    ),
    (
        "sampling_params a string",
        "POST",
        "/generate",
        {"text": "a", "sampling_params": "greedy"},
        400,
        "invalid request",
    ),
    (
        "max_new_tokens a string",
        "POST",
        "/generate",
        {"text": "a", "sampling_params": {"max_new_tokens": "8"}},
        400,
        "max_new_tokens must be",
    ),
    (
        "max_new_tokens a float",
        "POST",
        "/generate",
        {"text": "a", "sampling_params": {"max_new_tokens": 8.5}},
        400,
        "max_new_tokens must be",
    ),
    ("top_p above one", "POST", "/generate", {"text": "a", "sampling_params": {"top_p": 1.5}}, 400, "top_p"),
    ("min_p negative", "POST", "/generate", {"text": "a", "sampling_params": {"min_p": -0.1}}, 400, "min_p"),
    (
        "frequency penalty too big",
        "POST",
        "/generate",
        {"text": "a", "sampling_params": {"frequency_penalty": 3}},
        400,
        "frequency_penalty",
    ),
    (
        "repetition penalty zero",
        "POST",
        "/generate",
        {"text": "a", "sampling_params": {"repetition_penalty": 0}},
        400,
        "repetition_penalty",
    ),
    (
        "min_new_tokens negative",
        "POST",
        "/generate",
        {"text": "a", "sampling_params": {"min_new_tokens": -2}},
        400,
        "min_new_tokens",
    ),
    (
        "ignore_eos not a boolean",
        "POST",
        "/generate",
        {"text": "a", "sampling_params": {"ignore_eos": "yes"}},
        400,
        "ignore_eos",
    ),
    ("n of zero", "POST", "/generate", {"text": "a", "sampling_params": {"n": 0}}, 400, "n must be"),
    ("stop of a number", "POST", "/generate", {"text": "a", "sampling_params": {"stop": 5}}, 400, "stop must"),
    (
        "too many stop strings",
        "POST",
        "/generate",
        {"text": "a", "sampling_params": {"stop": ["x"] * 40}},
        400,
        "at most 16",
    ),
    (
        "too many stop token ids",
        "POST",
        "/generate",
        {"text": "a", "sampling_params": {"stop_token_ids": list(range(300))}},
        400,
        "at most 256",
    ),
    (
        "stream_interval of zero",
        "POST",
        "/generate",
        {"text": "a", "sampling_params": {"stream_interval": 0}},
        400,
        "stream_interval",
    ),
    (
        "no_stop_trim not a boolean",
        "POST",
        "/generate",
        {"text": "a", "sampling_params": {"no_stop_trim": 1}},
        400,
        "no_stop_trim",
    ),
    (
        "negative top_logprobs_num",
        "POST",
        "/generate",
        {"text": "a", "return_logprob": True, "top_logprobs_num": -1},
        400,
        "top_logprobs_num",
    ),
    (
        "logprob_start_len below -1",
        "POST",
        "/generate",
        {"text": "a", "return_logprob": True, "logprob_start_len": -5},
        400,
        "logprob_start_len",
    ),
    ("rid list for one prompt too long", "POST", "/generate", {"text": "a", "rid": ["x", "y"]}, 400, "rid"),
    ("a single rid for a batch", "POST", "/generate", {"text": ["a", "b"], "rid": "x"}, 400, "rid"),
    ("cache_salt too long", "POST", "/generate", {"text": "a", "cache_salt": "s" * 300}, 400, "cache_salt"),
    (
        "extra_key differing in a batch",
        "POST",
        "/generate",
        {"text": ["a", "b"], "extra_key": ["k1", "k2"]},
        400,
        "extra_key",
    ),
    ("generate for another model", "POST", "/generate", {"text": "a", "model": "gpt-9"}, 404, "does not exist"),
    (
        "json_schema of a number",
        "POST",
        "/generate",
        {"text": "a", "sampling_params": {"json_schema": 5}},
        400,
        "json_schema",
    ),
    ("empty choices", "POST", "/generate", {"text": "a", "sampling_params": {"choices": []}}, 400, "non-empty"),
    (
        "json_object false",
        "POST",
        "/generate",
        {"text": "a", "sampling_params": {"json_object": False}},
        400,
        "json_object",
    ),
    ("abort without rid", "POST", "/abort_request", {}, 400, "rid"),
    (
        "completion prompt of mixed types",
        "POST",
        "/v1/completions",
        {"model": "MODEL", "prompt": ["a", [1]]},
        400,
        "prompt",
    ),
    ("completion empty prompt list", "POST", "/v1/completions", {"model": "MODEL", "prompt": []}, 400, "prompt"),
    ("completion echo", "POST", "/v1/completions", {"model": "MODEL", "prompt": "a", "echo": True}, 400, "echo"),
    (
        "completion best_of",
        "POST",
        "/v1/completions",
        {"model": "MODEL", "prompt": "a", "best_of": 3},
        400,
        "best_of is not supported",
    ),
    (
        "completion unknown field",
        "POST",
        "/v1/completions",
        {"model": "MODEL", "prompt": "a", "temprature": 0},
        400,
        "temprature",
    ),
    (
        "chat content parts with an image",
        "POST",
        "/v1/chat/completions",
        {
            "model": "MODEL",
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
        },
        400,
        "text content",
    ),
    (
        "chat n too big",
        "POST",
        "/v1/chat/completions",
        {"model": "MODEL", "messages": [{"role": "user", "content": "a"}], "n": 500},
        400,
        "n must be",
    ),
    (
        "chat logit_bias",
        "POST",
        "/v1/chat/completions",
        {"model": "MODEL", "messages": [{"role": "user", "content": "a"}], "logit_bias": {"5": 1}},
        400,
        "logit_bias is not supported",
    ),
    (
        "chat response_format of an unknown type",
        "POST",
        "/v1/chat/completions",
        {"model": "MODEL", "messages": [{"role": "user", "content": "a"}], "response_format": {"type": "xml"}},
        400,
        "invalid request",
    ),
    (
        "chat for another model",
        "POST",
        "/v1/chat/completions",
        {"model": "gpt-9", "messages": [{"role": "user", "content": "a"}]},
        404,
        "does not exist",
    ),
    (
        "unsupported field set",
        "POST",
        "/generate",
        {"text": "a", "lora_path": "adapter"},
        400,
        "lora_path is not supported",
    ),
    (
        "custom logit processor",
        "POST",
        "/generate",
        {"text": "a", "custom_logit_processor": "x"},
        400,
        "never runs code",
    ),
    (
        "unsupported sampling field set",
        "POST",
        "/generate",
        {"text": "a", "sampling_params": {"beam_width": 2}},
        400,
        "beam_width is not supported",
    ),
    ("top_k beyond int64", "POST", "/generate", {"text": "a", "sampling_params": {"top_k": 2**63}}, 400, "top_k"),
    (
        "infinite temperature",
        "POST",
        "/generate",
        b'{"text": "a", "sampling_params": {"temperature": 1e400}}',
        400,
        "out of range",
    ),
    ("seed beyond int64", "POST", "/generate", {"text": "a", "sampling_params": {"seed": 2**64}}, 400, "seed"),
    (
        "stop token outside the vocabulary",
        "POST",
        "/v1/completions",
        {"model": "MODEL", "prompt": "a", "min_tokens": 1, "stop_token_ids": [60000]},
        400,
        "outside the vocabulary",
    ),
    (
        "negative stop token",
        "POST",
        "/generate",
        {"text": "a", "sampling_params": {"stop_token_ids": [-1]}},
        400,
        "stop_token_ids",
    ),
    (
        "repeated rid in a batch",
        "POST",
        "/generate",
        {"text": ["a", "b"], "rid": ["same", "same"]},
        400,
        "appears twice",
    ),
    (
        "invalid stop_regex",
        "POST",
        "/generate",
        {"text": "a", "sampling_params": {"stop_regex": "(a"}},
        400,
        "stop_regex",
    ),
    # regexes: RE2 runs every user pattern in linear time; what needs backtracking is refused
    (
        "stop_regex with lookahead",
        "POST",
        "/generate",
        {"text": "a", "sampling_params": {"stop_regex": "a(?=b)"}},
        400,
        "need a backtracking engine",
    ),
    (
        "stop_regex with a backreference",
        "POST",
        "/generate",
        {"text": "a", "sampling_params": {"stop_regex": ["x", r"(a)\1"]}},
        400,
        "backreferences",
    ),
    (
        "stop_regex over the compile budget",
        "POST",
        "/generate",
        {"text": "a", "sampling_params": {"stop_regex": [rf"\pL{{{n}}}" for n in range(40, 46)]}},
        400,
        "RE2 instructions in all",
    ),
    (
        "json_schema pattern with lookbehind",
        "POST",
        "/generate",
        {"text": "a", "sampling_params": {"json_schema": {"type": "string", "pattern": "(?<=a)b"}}},
        400,
        "json_schema pattern",
    ),
    (
        "json_schema patternProperties key with a backreference",
        "POST",
        "/generate",
        {"text": "a", "sampling_params": {"json_schema": {"type": "object", "patternProperties": {r"(a)\1": {}}}}},
        400,
        "json_schema patternProperties key",
    ),
    (
        "unevaluatedProperties beside patternProperties",
        "POST",
        "/generate",
        {
            "text": "a",
            "sampling_params": {
                "json_schema": {"type": "object", "patternProperties": {"^a": {}}, "unevaluatedProperties": False}
            },
        },
        400,
        "unevaluatedProperties together with patternProperties",
    ),
    (
        "unsupported OpenAI field set",
        "POST",
        "/v1/chat/completions",
        {"model": "MODEL", "messages": [{"role": "user", "content": "a"}], "continue_final_message": True},
        400,
        "continue_final_message is not supported",
    ),
    (
        "tool_choice without tools",
        "POST",
        "/v1/chat/completions",
        {"model": "MODEL", "messages": [{"role": "user", "content": "a"}], "tool_choice": "required"},
        400,
        "tool_choice",
    ),
    (
        "zero max_tokens",
        "POST",
        "/v1/chat/completions",
        {"model": "MODEL", "messages": [{"role": "user", "content": "a"}], "max_tokens": 0},
        400,
        "max_tokens",
    ),
    (
        "bad role",
        "POST",
        "/v1/chat/completions",
        {"model": "MODEL", "messages": [{"role": "robot", "content": "a"}]},
        400,
        "role",
    ),
    ("empty messages", "POST", "/v1/chat/completions", {"model": "MODEL", "messages": []}, 400, "messages"),
    (
        "completion logprobs too big",
        "POST",
        "/v1/completions",
        {"model": "MODEL", "prompt": "a", "logprobs": 50},
        400,
        "logprobs",
    ),
    (
        "top_logprobs without logprobs",
        "POST",
        "/v1/chat/completions",
        {"model": "MODEL", "messages": [{"role": "user", "content": "a"}], "top_logprobs": 2},
        400,
        "top_logprobs",
    ),
    (
        "json_schema without a schema",
        "POST",
        "/v1/chat/completions",
        {
            "model": "MODEL",
            "messages": [{"role": "user", "content": "a"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "x"}},
        },
        400,
        "json_schema.schema",
    ),
    (
        "unsatisfiable json_schema",
        "POST",
        "/v1/chat/completions",
        {
            "model": "MODEL",
            "messages": [{"role": "user", "content": "a"}],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "integer", "minimum": 3, "maximum": 1}},
            },
        },
        400,
        "minimum 3 is above maximum 1",
    ),
    ("invalid regex", "POST", "/generate", {"text": "a", "sampling_params": {"regex": "(ab"}}, 400, "regex"),
    (
        "two constraints",
        "POST",
        "/generate",
        {"text": "a", "sampling_params": {"regex": "a", "choices": ["a"]}},
        400,
        "at most one",
    ),
    (
        "non-local $ref",
        "POST",
        "/generate",
        {"text": "a", "sampling_params": {"json_schema": {"$ref": "http://x/y.json"}}},
        400,
        "not local",
    ),
    ("unknown route", "GET", "/v2/everything", None, 404, "no route"),
    # nesting: checked before anything recurses (deep JSON is sent as raw bytes: json.dumps recurses too)
    ("body nested 5000 deep", "POST", "/generate", DEEP_ARRAY.encode(), 400, "the limit is 64"),
    (
        "sampling_params nested 5000 deep",
        "POST",
        "/generate",
        f'{{"text": "a", "sampling_params": {{"stop": {DEEP_ARRAY}}}}}'.encode(),
        400,
        "at sampling_params.stop",
    ),
    (
        "regex nested 5000 deep",
        "POST",
        "/generate",
        {"text": "a", "sampling_params": {"regex": DEEP_GROUPS}},
        400,
        "regex nests groups 5000 levels deep; the limit is 64",
    ),
    (
        "json_schema nested 5000 deep",
        "POST",
        "/generate",
        f'{{"text": "a", "sampling_params": {{"json_schema": {DEEP_SCHEMA}}}}}'.encode(),
        400,
        "at sampling_params.json_schema",
    ),
    (
        "json_schema text nested 5000 deep",
        "POST",
        "/generate",
        {"text": "a", "sampling_params": {"json_schema": DEEP_SCHEMA}},
        400,
        "json_schema nests arrays and objects 5001 levels deep",
    ),
    (
        "json_schema pattern nested 5000 deep",
        "POST",
        "/generate",
        {"text": "a", "sampling_params": {"json_schema": {"type": "string", "pattern": DEEP_GROUPS}}},
        400,
        "pattern nests groups",
    ),
    (
        "structural_tag text nested 5000 deep",
        "POST",
        "/generate",
        {"text": "a", "sampling_params": {"structural_tag": DEEP_ARRAY}},
        400,
        "structural_tag nests",
    ),
    (
        "response_format schema nested 5000 deep",
        "POST",
        "/v1/chat/completions",
        f'{{{CHAT}, "response_format": {{"type": "json_schema", "json_schema": {{"name": "x", "schema": {DEEP_SCHEMA}}}}}}}'.encode(),
        400,
        "at response_format.json_schema.schema",
    ),
    (
        "chat content part nested 5000 deep",
        "POST",
        "/v1/chat/completions",
        f'{{"messages": [{{"role": "user", "content": [{{"type": "text", "text": {DEEP_ARRAY}}}]}}]}}'.encode(),
        400,
        "at messages[0].content[0].text",
    ),
    (
        "tool-call arguments nested 5000 deep",
        "POST",
        "/v1/chat/completions",
        {
            "model": "MODEL",
            "messages": [
                {"role": "user", "content": "a"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": DEEP_ARRAY}}
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "b"},
            ],
        },
        400,
        "function.arguments of the call to f nests",
    ),
    (
        "json_schema with an infinite bound",
        "POST",
        "/generate",
        {"text": "a", "sampling_params": {"json_schema": '{"type": "number", "minimum": 1e400}'}},
        400,
        "must be a finite number",
    ),
    # invalid tool parameter schemas: a 400 naming the tool, whatever tool_choice is
    (
        "tool schema of an unknown type",
        "POST",
        "/v1/chat/completions",
        _tool({"properties": {"a": {"type": "frob"}}}),
        400,
        "parameters schema is invalid: 'frob' is not valid under any of the given schemas (at properties/a/type)",
    ),
    (
        "tool schema with a dangling $ref",
        "POST",
        "/v1/chat/completions",
        _tool({"properties": {"a": {"$ref": "#/$defs/missing"}}}, NAMED),
        400,
        "tools[0] (f): parameters schema",
    ),
    (
        "tool schema with contradictory bounds",
        "POST",
        "/v1/chat/completions",
        _tool({"properties": {"a": {"type": "integer", "minimum": 5, "maximum": 1}}, "required": ["a"]}),
        400,
        "minimum 5 is above maximum 1",
    ),
    (
        "tool schema properties a list",
        "POST",
        "/v1/chat/completions",
        _tool({"properties": [{"a": 1}]}, NAMED),
        400,
        "is not of type 'object' (at properties)",
    ),
    (
        "tool schema required a number",
        "POST",
        "/v1/chat/completions",
        _tool({"properties": {"a": {"type": "string"}}, "required": 5}),
        400,
        "is not of type 'array' (at required)",
    ),
    (
        "tool schema invalid under auto",
        "POST",
        "/v1/chat/completions",
        _tool({"properties": {"a": {"type": "frob"}}}, "auto"),
        400,
        "tools[0] (f): parameters schema is invalid",
    ),
]


def test_no_bad_input_is_expected_to_get_a_5xx():
    assert [c[0] for c in BAD_INPUTS if not 400 <= c[4] < 500] == []


@pytest.fixture(scope="module")
def tenants(tiny_model, tmp_path_factory) -> Iterator[Server]:
    """A server with tenant keys A and B and an admin key (from files, as a deployment has them)."""
    keys = tmp_path_factory.mktemp("keys")
    (keys / "tenants").write_text(f"{TENANT_A}\n{TENANT_B}\n")
    (keys / "admin").write_text(ADMIN + "\n")
    s = start_server(
        str(tiny_model("llama")),
        "--api-key-file",
        str(keys / "tenants"),
        "--admin-api-key-file",
        str(keys / "admin"),
        "--max-body-bytes",
        "200000",
        "--enable-cache-report",
    )
    yield s
    stop_server(s)


def _other_tenant_is_served(server: Server) -> None:
    """Tenant B's normal request completes within 2 s; the admin sees the KV invariant hold."""
    started = time.perf_counter()
    ok, out = server.request(
        "POST", "/generate", {"text": "still up", "sampling_params": {"max_new_tokens": 2}}, key=TENANT_B
    )
    assert ok == 200 and out["meta_info"]["completion_tokens"] <= 2, out
    assert time.perf_counter() - started < 2.0
    assert server.request("GET", "/get_server_info", key=ADMIN)[1]["stats"]["invariant_ok"] == 1.0


@pytest.mark.parametrize("case", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_gets_a_clear_4xx(tenants, case):
    name, method, path, body, status, fragment = case
    if isinstance(body, dict):
        body = json.loads(json.dumps(body).replace("MODEL", tenants.model))
    raw = body if isinstance(body, bytes) else None
    got, payload = tenants.request(method, path, None if raw else body, raw=raw, key=TENANT_A)
    assert got < 500, f"{name!r} got {got}: a 5xx is Arbor's bug, never the request's: {payload}"
    assert got == status, payload
    error = payload["error"]
    assert fragment in error["message"] and error["code"] == status
    _other_tenant_is_served(tenants)


def test_a_catastrophic_stop_regex_over_a_forced_output_stalls_nobody(tenants):
    # Backtracking, each pattern takes exponential time on the run of "a"s that `regex` forces.
    attack = {
        "text": "a",
        "sampling_params": {
            "regex": "a{200}",
            "stop_regex": ["(a|aa)+b$", "(a+)+b"],
            "max_new_tokens": 256,
            "temperature": 0,
        },
    }
    started = time.perf_counter()
    status, out = tenants.request("POST", "/generate", attack, key=TENANT_A)
    assert status == 200 and out["text"] == "a" * 200, out
    assert time.perf_counter() - started < 30
    assert tenants.request("GET", "/health", key=None)[0] == 200
    _other_tenant_is_served(tenants)


def test_docs_list_every_bad_input_case():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "server.md").read_text()
    assert [c[0] for c in BAD_INPUTS if f"| {c[0]} |" not in doc] == []


def test_chat_text_that_spells_a_splice_placeholder_is_plain_text(server):
    # The chat tokenizer splices a remembered answer's ids in at a private-use mark; chat text
    # that spells such marks (and the turn after a remembered answer, which is spliced) is text.
    forged = "\ue0000\ue001 \ue00099\ue001 \ue000"
    ask = {"model": server.model, "max_tokens": 4, "temperature": 0}
    first = server.request("POST", "/v1/chat/completions", {**ask, "messages": [{"role": "user", "content": forged}]})
    assert first[0] == 200, first[1]
    answer = first[1]["choices"][0]["message"]["content"]
    messages = [
        {"role": "user", "content": forged},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": forged},
    ]
    got, payload = server.request("POST", "/v1/chat/completions", {**ask, "messages": messages})
    assert got == 200, payload
