"""The DSL against a live server on the tiny random checkpoint: the text is noise, so the
tests check structure (variables, messages, constraints, caching), not content."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

import arbor as sgl

IPV4 = r"((25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?)\.){3}(25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?)"
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
}


def test_gen_with_stop_and_max_tokens(backend) -> None:
    @sgl.function
    def prog(s):
        s += "Q: say something\nA:" + sgl.gen("a", max_tokens=5, temperature=0)
        s += "\nB:" + sgl.gen("b", max_tokens=40, stop=[" the", "e"], temperature=1.0, seed=3)

    state = prog.run()
    assert state.get_meta_info("a")["completion_tokens"] == 5
    assert state.get_meta_info("a")["finish_reason"]["type"] == "length"
    assert "e" not in state["b"] and " the" not in state["b"]
    assert state.text().endswith("\nB:" + state["b"])


def test_regex_dtype_and_json_schema(backend) -> None:
    @sgl.function
    def prog(s, i):
        s += f"Server {i} IP: " + sgl.gen("ip", regex=IPV4, temperature=1.0)
        s += "\nHours: " + sgl.gen_int("hours", temperature=1.0) + "\nPi: " + sgl.gen("pi", dtype=float)
        s += "\nSky blue: " + sgl.gen("blue", dtype=bool) + "\nName: " + sgl.gen_string("name")
        s += "\nPerson: " + sgl.gen("person", json_schema=PERSON, temperature=1.0, max_tokens=200)

    for state in prog.run_batch([{"i": i} for i in range(6)]):
        assert re.fullmatch(IPV4, state["ip"])
        int(state["hours"])
        float(state["pi"])
        assert state["blue"] in ("True", "False")
        assert json.loads(state["name"]) is not None  # a quoted string
        jsonschema.validate(json.loads(state["person"]), PERSON)


def test_select_and_choices_return_a_choice(backend) -> None:
    options = ["True", "False", "Unknown"]

    @sgl.function
    def prog(s, statement):
        s += "Statement: " + statement + "\nAnswer:" + sgl.select("answer", options)
        s += "\nColor:" + sgl.gen("color", choices=["red", "green", "a much longer blue"])
        s += "\nFirst:" + sgl.select("first", ["yes", "no"], choices_method="greedy_token")

    for state in prog.run_batch([{"statement": f"claim {i}"} for i in range(5)]):
        assert state["answer"] in options and state["color"] in ("red", "green", "a much longer blue")
        assert state["first"] in ("yes", "no")
        scores = state.get_meta_info("answer")["scores"]
        assert len(scores) == 3 and scores[options.index(state["answer"])] == max(scores)


def test_roles_build_the_message_list(backend) -> None:
    @sgl.function
    def chat(s, q1, q2):
        s += sgl.system("You are terse.")
        s += sgl.user(q1)
        s += sgl.assistant(sgl.gen("a1", max_tokens=6))
        with s.user():
            s += q2
        s += sgl.assistant_begin()
        s += sgl.gen("a2", max_tokens=6)
        s += sgl.assistant_end()

    state = chat.run(q1="Hi", q2="Again")
    messages = state.messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert [m["content"] for m in messages] == ["You are terse.", "Hi", state["a1"], "Again", state["a2"]]
    roles = backend.model_info()["chat_roles"]  # the checkpoint's own template frames each turn
    assert state.text().startswith(roles["system"][0] + "You are terse." + roles["system"][1])


def test_fork_join_gathers_branch_variables(backend) -> None:
    @sgl.function
    def tips(s):
        s += "Tips:\n"
        forks = s.fork(5)
        for i, f in enumerate(forks):
            f += f"Tip {i + 1}:" + sgl.gen("tip", max_tokens=6, temperature=1.0, seed=i)
        forks.join()
        s += "Summary:" + "".join(forks[i]["tip"] for i in range(5))

    state = tips.run()
    assert len(state["tip"]) == 5 and all(isinstance(t, str) for t in state["tip"])
    assert state.text().endswith("Summary:" + "".join(state["tip"]))


def test_concate_and_append_join(backend) -> None:
    @sgl.function
    def enc(s, facts):
        s += "Facts:\n"
        forks = s.fork(len(facts))
        forks += lambda i: f"Statement {i}: {facts[i]}\n"
        forks.join(mode="concate_and_append")
        s += "Q:" + sgl.gen("answer", max_tokens=4)

    state = enc.run(facts=["a is b.", "c is d.", "e is f."])
    assert "Statement 0: a is b.\nStatement 1: c is d.\nStatement 2: e is f.\nQ:" in state.text()


def test_streaming_equals_non_streaming(backend) -> None:
    @sgl.function
    def qa(s, q):
        s += sgl.user(q)
        s += sgl.assistant(sgl.gen("answer", max_tokens=24, temperature=0))

    whole = qa.run(q="Tell me a story")
    streamed = qa.run(q="Tell me a story", stream=True)
    assert "".join(streamed.text_iter()) == whole.text()
    again = qa.run(q="Tell me a story", stream=True)
    assert "".join(again.text_iter("answer")) == whole["answer"]


def test_run_batch_of_32(backend) -> None:
    @sgl.function
    def prog(s, i):
        s += f"Item {i}:" + sgl.gen("x", max_tokens=4, temperature=1.0, seed=i)

    states = prog.run_batch([{"i": i} for i in range(32)], num_threads=8, progress_bar=True)
    assert [s.text().split(":")[0] for s in states] == [f"Item {i}" for i in range(32)]
    assert all(s.get_meta_info("x")["completion_tokens"] == 4 for s in states)


def test_fork_from_a_long_context_hits_the_cache(backend) -> None:
    context = " ".join(f"w{i}" for i in range(700))  # ~1,400 tokens

    @sgl.function
    def branches(s):
        s += "Context: " + context + "\n"
        forks = s.fork(8)
        for i, f in enumerate(forks):
            f += f"Branch {i}:" + sgl.gen("out", max_tokens=4)
        forks.join()
        s["forks"] = forks

    state = branches.run()
    metas = [f.get_meta_info("out") for f in state["forks"]]
    assert all(m["prompt_tokens"] > 1000 for m in metas)
    assert all(m["cached_tokens"] >= 1000 for m in metas), [m["cached_tokens"] for m in metas]


def test_errors_are_clear(backend) -> None:
    @sgl.function
    def bad(s):
        s += sgl.gen("x", regex="(unclosed")

    with pytest.raises(sgl.BackendError, match="HTTP 400"):
        bad.run()

    @sgl.function
    def missing(s):
        s += "text"
        s["never"]  # reading it is the test

    with pytest.raises(KeyError, match="never"):
        missing.run()
    with pytest.raises(ValueError, match="dtype"):
        sgl.gen(dtype=list)


def test_bind_and_engine_backend(tiny_model) -> None:
    backend = sgl.EngineBackend(model_path=str(tiny_model("llama")), dtype="float32")
    try:

        @sgl.function
        def prog(s, a, b):
            s += f"{a}+{b}=" + sgl.gen_int("sum") + " " + sgl.select("w", ["ok", "no"])

        state = prog.bind(a=2).run(b=3, backend=backend)
        int(state["sum"])
        assert state["w"] in ("ok", "no") and state.text().startswith("2+3=")
    finally:
        backend.shutdown()


def test_openai_backend(dsl_server) -> None:
    from tests.frontend_lang.conftest import KEY

    backend = sgl.OpenAI(dsl_server.model, base_url=dsl_server.base_url + "/v1", api_key=KEY)

    @sgl.function
    def chat(s):
        s += sgl.system("Be brief.")
        s += sgl.user("Give JSON.")
        s += sgl.assistant(sgl.gen("reply", max_tokens=120, json_schema=PERSON))

    state = chat.run(backend=backend)
    jsonschema.validate(json.loads(state["reply"]), PERSON)
    assert [m["role"] for m in state.messages()] == ["system", "user", "assistant"]

    @sgl.function
    def plain(s):
        s += "Answer:" + sgl.gen("a", max_tokens=5, temperature=0) + sgl.select("c", ["x", "y"])

    state = plain.run(backend=backend)
    assert state.get_meta_info("a")["completion_tokens"] == 5 and state["c"] in ("x", "y")
