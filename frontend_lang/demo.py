"""`arbor demo`: the whole product in about a minute. Starts a server on 127.0.0.1, runs an
agent program through the DSL (roles, a multi-turn chat, select, json_schema, fork), makes
one official-openai-client call with response_format json_schema and one streamed call, then
prints TTFT/TPOT and the radix cache hit rate and stops the server."""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from arbor.frontend_lang import api as sgl
from arbor.frontend_lang.backends import RuntimeEndpoint
from arbor.runtime.config import ServerArgs

TOOL_CALL: dict[str, Any] = {
    "type": "object",
    "properties": {
        "tool": {"enum": ["search", "calculator"]},
        "query": {"type": "string", "maxLength": 24},
        "top_k": {"type": "integer", "minimum": 1, "maximum": 5},
    },
    "required": ["tool", "query", "top_k"],
}
CITY: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 16},
        "population": {"type": "integer", "minimum": 0},
        "capital": {"type": "boolean"},
    },
    "required": ["city", "population", "capital"],
}
RANDOM_WEIGHTS = (
    "NOTE: the built-in checkpoint has random weights: the text is noise, the structure is real "
    "(every JSON below parses and validates, every select is one of its choices).\n"
    "Run `arbor demo --model-path DIR` with a Hugging Face Llama/Qwen/Mistral checkpoint "
    "directory for real text."
)


def add_command(sub: argparse._SubParsersAction) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Register `arbor demo` (every server flag applies) and return its handler."""
    demo = sub.add_parser(
        "demo",
        help="start a server, run an agent program (DSL) and OpenAI-client calls, "
        "print outputs, TTFT/TPOT and the cache hit rate, stop",
    )
    ServerArgs.add_cli_args(demo)
    return {"demo": _run_from_cli}


def _run_from_cli(cli_args: argparse.Namespace) -> int:
    from arbor.runtime.cli import setup_logging

    args = ServerArgs.from_cli_args(cli_args)
    setup_logging(args.log_level)
    return run_demo(args)


def run_demo(args: ServerArgs) -> int:
    """Run the tour against a server started on `args` (its port is replaced by a free one)."""
    import logging

    import uvicorn

    from arbor.runtime.server.app import create_app
    from arbor.runtime.server.auth import Keys
    from arbor.runtime.server.connections import uvicorn_config

    for noisy in ("httpx", "httpx2"):  # one INFO line per HTTP call of the openai client
        logging.getLogger(noisy).setLevel(logging.WARNING)
    args = args.with_flags(port=_free_port(args.http.host))
    app = create_app(args)  # a bad checkpoint fails here, in one line
    server = uvicorn.Server(uvicorn_config(app, args.http, "warning"))
    thread = threading.Thread(target=server.run, name="arbor-demo-server", daemon=True)
    thread.start()
    base = f"http://{args.http.host}:{args.http.port}"
    try:
        _wait_started(server, thread)
        print(RANDOM_WEIGHTS, "\n")
        key = Keys.load(args.http, args.disagg).first
        backend = RuntimeEndpoint(base, api_key=key)
        _agent(backend)
        _openai_calls(base, key)
        stats = backend.server_info()["stats"]
        print(
            f"radix cache hit rate: {100 * stats.get('cache_hit_rate', 0):.1f}% of prompt tokens "
            f"(fork branches, chat turns and select choices reuse earlier KV)"
        )
    finally:
        server.should_exit = True
        thread.join(30)
    return 0


def _agent(backend: RuntimeEndpoint) -> None:
    @sgl.function
    def agent(s, question):
        s += sgl.system("You are a research agent. Tools: search, calculator.")
        s += sgl.user(question)
        with s.assistant():
            s += "Thought:" + sgl.gen("thought", max_tokens=12, stop="\n")
            s += "\nAction: " + sgl.select("action", ["search", "calculator", "finish"])
            s += "\nCall: " + sgl.gen("call", json_schema=TOOL_CALL, max_tokens=64)
        s += sgl.user("Observation: 3 results. Brainstorm next steps.")
        with s.assistant():
            ideas = s.fork(3)  # the conversation so far is prefilled once, shared by all branches
            ideas += lambda i: f"Idea {i + 1}:" + sgl.gen("idea", max_tokens=8, stop="\n")
            ideas.join()
            s += "Next steps: " + "; ".join(s["idea"])
        s += sgl.user("Give the final answer as one word.")
        s += sgl.assistant(sgl.gen("answer", max_tokens=6))

    t0 = time.perf_counter()
    state = agent.run(question="Which city hosts the largest radix tree?", temperature=1.0, backend=backend)
    seconds = time.perf_counter() - t0
    print("agent program (roles, select, json_schema, fork, 3 chat turns):")
    print(f"  thought: {state['thought']!r}")
    print(f"  action:  {state['action']!r}  (select over search / calculator / finish)")
    print(f"  call:    {json.dumps(json.loads(state['call']))}  (json_schema, parsed)")
    print(f"  ideas:   {state['idea']}  (fork of 3)")
    print(f"  answer:  {state['answer']!r}")
    print(f"  {len(state.messages())} chat messages, {seconds:.2f} s\n")


def _openai_calls(base: str, api_key: str | None) -> None:
    import openai

    client = openai.OpenAI(base_url=base + "/v1", api_key=api_key or "none")
    model = client.models.list().data[0].id
    reply = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Describe a city as JSON."}],
        max_tokens=80,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": CITY, "strict": True}},
    )
    print("openai client, response_format json_schema:")
    print(f"  {json.dumps(json.loads(reply.choices[0].message.content or ''))}\n")
    t0 = time.perf_counter()
    stamps = []
    for chunk in client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Tell a story."}],
        max_tokens=32,
        stream=True,
        extra_body={"ignore_eos": True},
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            stamps.append(time.perf_counter() - t0)
    if len(stamps) > 1:
        tpot = (stamps[-1] - stamps[0]) / (len(stamps) - 1)
        print(f"streamed chat: TTFT {1000 * stamps[0]:.0f} ms, TPOT {1000 * tpot:.1f} ms over {len(stamps)} chunks")


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _wait_started(server: Any, thread: threading.Thread, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the demo server did not start; run `arbor serve` to see its log")
        time.sleep(0.1)
