"""Tool calling through the official `openai` client, for each --tool-call-parser format, on
checkpoints whose chat templates render tools: forced calls (required, a named function)
always carry arguments that validate, streamed and not; tool turns render; bad tool fields
get a 400 that says what to change."""

from __future__ import annotations

import json
from collections.abc import Iterator

import jsonschema
import openai
import pytest

from arbor.runtime.server.tool_parsers import PARSERS
from arbor.runtime.server.tools import ToolPlan, ToolStream
from tests.server.conftest import start_server, stop_server
from tests.server.tool_templates import with_tool_template

WEATHER = {
    "name": "get_weather",
    "description": "Weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 12},
            "unit": {"enum": ["c", "f"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
        },
        "required": ["city", "unit"],
    },
}
SEARCH = {
    "name": "search",
    "parameters": {
        "type": "object",
        "properties": {
            "query": {"type": "string", "minLength": 1, "maxLength": 16},
            "limit": {"type": "integer", "minimum": 1, "maximum": 20},
        },
        "required": ["query"],
    },
}
TOOLS = [{"type": "function", "function": WEATHER}, {"type": "function", "function": SEARCH}]
SCHEMAS = {f["name"]: f["parameters"] for f in (WEATHER, SEARCH)}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module", params=sorted(PARSERS))
def tools_client(request, tiny_model, tmp_path_factory) -> Iterator[tuple[str, openai.OpenAI, str]]:
    fmt = request.param
    path = with_tool_template(tiny_model("llama"), tmp_path_factory.mktemp("tools") / f"llama-{fmt}", fmt)
    server = start_server(str(path), "--tool-call-parser", fmt)
    yield fmt, openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0), server.model
    stop_server(server)


def _valid(name: str, arguments: str) -> None:
    jsonschema.validate(json.loads(arguments), SCHEMAS[name], format_checker=jsonschema.FormatChecker())


def test_required_calls_always_validate_at_temperature_1(tools_client):
    _, client, model = tools_client
    for seed in range(6):
        parallel = seed % 2 == 0
        out = client.chat.completions.create(
            model=model,
            messages=ASK,
            tools=TOOLS,
            tool_choice="required",
            parallel_tool_calls=parallel,
            temperature=1,
            seed=seed,
            max_tokens=400,
        )
        choice = out.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        calls = choice.message.tool_calls
        assert calls and (parallel or len(calls) == 1), calls
        for call in calls:
            assert call.type == "function" and call.id.startswith("call_")
            _valid(call.function.name, call.function.arguments)


def test_named_function_streamed(tools_client):
    fmt, client, model = tools_client
    pieces = []
    for seed in range(3):
        args = dict(
            model=model,
            messages=ASK,
            tools=TOOLS,
            temperature=1,
            seed=seed,
            max_tokens=400,
            tool_choice={"type": "function", "function": {"name": "search"}},
        )
        stream = client.chat.completions.create(stream=True, **args)
        calls: dict[int, dict[str, str]] = {}
        content, reasons = "", []
        for chunk in stream:
            delta = chunk.choices[0].delta
            content += delta.content or ""
            for tc in delta.tool_calls or []:
                call = calls.setdefault(tc.index, {"name": "", "arguments": "", "id": "", "pieces": 0})
                call["id"] += tc.id or ""
                call["name"] += (tc.function.name or "") if tc.function else ""
                call["arguments"] += (tc.function.arguments or "") if tc.function else ""
                call["pieces"] += bool(tc.function and tc.function.arguments)
            reasons.append(chunk.choices[0].finish_reason)
        assert reasons[-1] == "stop" and content == "", (reasons, content)  # OpenAI: a forced call stops
        assert calls and all(c["name"] == "search" and c["id"] for c in calls.values()), calls
        for c in calls.values():
            _valid(c["name"], c["arguments"])
            pieces.append(c["pieces"])
        whole = client.chat.completions.create(**args).choices[0].message.tool_calls
        assert [c.function.arguments for c in whole] == [c["arguments"] for c in calls.values()]
    if fmt != "pythonic":  # JSON formats stream the arguments as they are written
        assert max(pieces) > 1, pieces


def test_tool_turns_render_and_auto_answers(tools_client):
    """A conversation holding a call and its result is accepted; under "auto" the model may
    answer in text or call (a random tiny model mostly writes text)."""
    _, client, model = tools_client
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris", "unit": "c"})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny"},
    ]
    out = client.chat.completions.create(model=model, messages=history, tools=TOOLS, max_tokens=24, temperature=0)
    choice = out.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    assert isinstance(choice.message.content, str) or choice.message.tool_calls
    none = client.chat.completions.create(
        model=model, messages=history, tools=TOOLS, tool_choice="none", max_tokens=8, temperature=0
    )
    assert none.choices[0].message.tool_calls is None


def test_template_writes_tool_turns_in_the_family_format(tiny_model, tmp_path):
    from transformers import AutoTokenizer

    from arbor.runtime.server.chat import ChatTokenizer

    want = {
        "qwen25": '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>',
        "llama3": '{"name": "f", "parameters": {"a": 1}}',
        "mistral": '[TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}}]',
        "pythonic": "[f(a=1)]",
    }
    for fmt, text in want.items():
        path = with_tool_template(tiny_model("llama"), tmp_path / fmt, fmt)
        tok = AutoTokenizer.from_pretrained(path)
        ids = ChatTokenizer(tok).encode(
            [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}],
                },
            ],
            [TOOLS[0]],
        )
        rendered = tok.decode(ids)
        assert text in rendered and '"get_weather"' in rendered, rendered
        assert PARSERS[fmt]().parse(text)[1][0].arguments == '{"a": 1}'


# ------------------------------------------------------------------------ parsing


@pytest.mark.parametrize(
    ("fmt", "text", "content", "names"),
    [
        (
            "qwen25",
            'Let me check.\n<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
            '<tool_call>\n{"name": "b", "arguments": {}}\n</tool_call>',
            "Let me check.",
            ["a", "b"],
        ),
        ("qwen25", "<tool_call>\n{not json}\n</tool_call>", None, []),
        (
            "llama3",
            '<|python_tag|>{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}}',
            "",
            ["a", "b"],
        ),
        ("llama3", "{this is prose in braces}", None, []),
        ("mistral", 'Sure [TOOL_CALLS] [{"name": "a", "arguments": {"x": 1}}]', "Sure", ["a"]),
        ("pythonic", '[a(x=1, flag=true), b(s="t")]', "", ["a", "b"]),
        ("pythonic", "[1, 2, 3]", None, []),
    ],
)
def test_parsers(fmt, text, content, names):
    got_content, calls = PARSERS[fmt]().parse(text)
    assert [c.name for c in calls] == names
    assert got_content == (text if content is None else content)
    for c in calls:
        assert isinstance(json.loads(c.arguments), dict)


ARGS = '{"x": 1, "y": "long {text} here"}'
WRITTEN = {  # two calls, a(**ARGS) and b(), as each format writes them
    "qwen25": f'<tool_call>\n{{"name": "a", "arguments": {ARGS}}}\n</tool_call>\n'
    '<tool_call>\n{"name": "b", "arguments": {}}\n</tool_call>',
    "llama3": f'{{"name": "a", "parameters": {ARGS}}}; {{"name": "b", "parameters": {{}}}}',
    "mistral": f'[TOOL_CALLS] [{{"name": "a", "arguments": {ARGS}}}, {{"name": "b", "arguments": {{}}}}]',
}


@pytest.mark.parametrize("fmt", sorted(WRITTEN))
def test_forced_calls_stream_their_arguments_as_they_grow(fmt):
    plan = ToolPlan(PARSERS[fmt](), [{"name": "a"}, {"name": "b"}], "required", True)
    full = WRITTEN[fmt]
    stream, got = ToolStream(plan), []
    for n in range(1, len(full)):
        assert stream.step(full[:n], False) == ""
        got += stream.progress(full[:n])
    assert stream.step(full, True) == "" and [c.name for c in stream.calls] == ["a", "b"]
    got += stream.deltas()
    heads = [d for d in got if "id" in d]
    assert [(d["index"], d["function"]["name"]) for d in heads] == [(0, "a"), (1, "b")]
    args = ["".join(d["function"]["arguments"] for d in got if d["index"] == i) for i in (0, 1)]
    assert args == [ARGS, "{}"]
    assert sum(1 for d in got if d["index"] == 0 and d["function"]["arguments"]) > 5  # piece by piece


def test_stream_split_holds_back_a_possible_call():
    plan = ToolPlan(PARSERS["qwen25"](), [{"name": "a"}], "auto", True)
    split = ToolStream(plan)
    full = 'Hi there <tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>'
    sent = [split.step(full[:n], False) for n in (3, 10, 12, 40)]
    assert "".join(sent) == "Hi there "  # "<t" is held: it may open a call
    assert split.step(full, True) == "" and [c.name for c in split.calls] == ["a"]
    deltas = split.deltas()
    assert deltas[0]["function"] == {"name": "a", "arguments": ""} and deltas[1]["function"]["arguments"] == '{"x": 1}'
    prose = ToolStream(plan)
    assert prose.step("a <to", False) == "a " and prose.step("a <tox>", True) == "<tox>"


# ------------------------------------------------------------------------ refusals


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"tools": TOOLS}, "--tool-call-parser"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "not among the tools"),
        ({"tool_choice": "required"}, "needs tools"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "function.name"),
        ({"tools": TOOLS, "tool_choice": "bogus"}, "tool_choice must be"),
    ],
)
def test_bad_tool_fields_are_400(server, body, says):
    status, out = server.request("POST", "/v1/chat/completions", {"model": server.model, "messages": ASK, **body})
    assert status == 400 and says in out["error"]["message"], out


def test_tool_turn_needs_its_call_id_and_none_works_without_a_parser(server, client):
    status, out = server.request(
        "POST",
        "/v1/chat/completions",
        {"model": server.model, "messages": [*ASK, {"role": "tool", "content": "18 degrees"}]},
    )
    assert status == 400 and "tool_call_id" in out["error"]["message"], out
    reply = client.chat.completions.create(
        model=server.model, messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=4
    )
    assert reply.choices[0].message.tool_calls is None
