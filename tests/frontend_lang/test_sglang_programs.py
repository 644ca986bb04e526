"""Programs written the way SGLang's frontend tests write them (few-shot QA, mt_bench, select,
decode_json with var_scope, regex, dtype_gen, parallel decoding, streaming), with only the
import line changed: `import frontend_lang as sgl`. Assertions are structural (the tiny
checkpoint's weights are random)."""

from __future__ import annotations

import json
import re

import arbor as sgl
from arbor.frontend_lang.ir import REGEX_FLOAT, REGEX_INT, REGEX_STR


def test_few_shot_qa_structure(backend) -> None:
    @sgl.function
    def few_shot_qa(s, question):
        s += "The following are questions with answers.\n\n"
        s += "Q: What is the capital of France?\nA: Paris\n"
        s += "Q: What is the capital of Germany?\nA: Berlin\n"
        s += "Q: " + question + "\n"
        s += "A:" + sgl.gen("answer", stop="\n", temperature=0)

    ret = few_shot_qa.run(question="What is the capital of Peru?")
    assert isinstance(ret["answer"], str) and "\n" not in ret["answer"]
    rets = few_shot_qa.run_batch(
        [{"question": "Japan?"}, {"question": "Chile?"}, {"question": "Mali?"}], temperature=0.1
    )
    assert len(rets) == 3 and all("\n" not in r["answer"] for r in rets)


def test_mt_bench(backend) -> None:
    @sgl.function
    def answer_mt_bench(s, question_1, question_2):
        s += sgl.system("You are a helpful assistant.")
        s += sgl.user(question_1)
        s += sgl.assistant(sgl.gen("answer_1"))
        with s.user():
            s += question_2
        with s.assistant():
            s += sgl.gen("answer_2")

    ret = answer_mt_bench.run(
        question_1="Write a travel post.", question_2="Rewrite it.", temperature=0.7, max_new_tokens=16
    )
    assert len(ret.messages()) in [4, 5]


def test_select(backend) -> None:
    @sgl.function
    def true_or_false(s, statement):
        s += "Determine whether the statement below is True, False, or Unknown.\n"
        s += "Statement: " + statement + "\n"
        s += "Answer:" + sgl.select("answer", ["True", "False", "Unknown"])

    for statement in ("Berlin is in Germany.", "Tokyo is in Canada.", "Purple beats green."):
        assert true_or_false.run(statement=statement)["answer"] in ["True", "False", "Unknown"]


def test_decode_json_regex_and_dtypes(backend) -> None:
    @sgl.function
    def decode_json_regex(s):
        s += "Generate a JSON object to describe the basic city information of Paris.\n"
        with s.var_scope("json_output"):
            s += "{\n"
            s += '  "name": ' + sgl.gen(regex=REGEX_STR) + ",\n"
            s += '  "population": ' + sgl.gen(regex=REGEX_INT, stop=[" ", "\n"]) + ",\n"
            s += '  "latitude": ' + sgl.gen(regex=REGEX_FLOAT, stop=[" ", "\n"]) + "\n"
            s += "}"

    @sgl.function
    def decode_json(s):
        s += "Generate a JSON object to describe the basic city information of Paris.\n"
        with s.var_scope("json_output"):
            s += "{\n"
            s += '  "name": ' + sgl.gen_string() + ",\n"
            s += '  "population": ' + sgl.gen_int() + ",\n"
            s += '  "area": ' + sgl.gen(dtype=int) + ",\n"
            s += '  "timezone": ' + sgl.gen(dtype=str) + "\n"
            s += "}"

    for program in (decode_json_regex, decode_json):
        js_obj = json.loads(program.run(temperature=1.0, max_new_tokens=64)["json_output"])
        assert isinstance(js_obj["name"], str) and isinstance(js_obj["population"], int)


def test_regex(backend) -> None:
    regex = r"((25[0-5]|2[0-4]\d|[01]?\d\d?).){3}(25[0-5]|2[0-4]\d|[01]?\d\d?)"

    @sgl.function
    def regex_gen(s):
        s += "Q: What is the IP address of the Google DNS servers?\n"
        s += "A: " + sgl.gen("answer", temperature=0, regex=regex)

    assert re.match(regex, regex_gen.run()["answer"])


def test_dtype_gen(backend) -> None:
    @sgl.function
    def dtype_gen(s):
        s += "Q: What is the full name of DNS?\n"
        s += "A: The full name is " + sgl.gen("str_res", dtype=str, stop="\n") + "\n"
        s += "Q: Which year was DNS invented?\n"
        s += "A: " + sgl.gen("int_res", dtype=int) + "\n"
        s += "Q: What is the value of pi?\n"
        s += "A: " + sgl.gen("float_res", dtype=float) + "\n"
        s += "Q: Is the sky blue?\n"
        s += "A: " + sgl.gen("bool_res", dtype=bool) + "\n"

    state = dtype_gen.run()
    state["int_res"] = int(state["int_res"])
    state["float_res"] = float(state["float_res"])
    state["bool_res"] = bool(state["bool_res"])
    assert state["str_res"].startswith('"') and state["str_res"].endswith('"')


def test_parallel_decoding(backend) -> None:
    fork_size = 5

    @sgl.function
    def parallel_decoding(s, topic):
        s += "Act as a helpful assistant.\n"
        s += "USER: Give some tips for " + topic + ".\n"
        s += "ASSISTANT: Okay. Here are " + str(fork_size) + " concise tips, each under 8 words:\n"
        for i in range(1, 1 + fork_size):
            s += f"{i}." + sgl.gen(max_tokens=8, stop=[".", "\n"]) + ".\n"
        forks = s.fork(fork_size)
        for i in range(fork_size):
            forks[i] += f"Now, I expand tip {i + 1} into a detailed paragraph:\nTip {i + 1}:"
            forks[i] += sgl.gen("detailed_tip", 16, stop=["\n\n"])
        forks.join()
        s += "Here are these tips with detailed explanation:\n"
        for i in range(fork_size):
            s += f"Tip {i + 1}:" + forks[i]["detailed_tip"] + "\n"
        s += "\nIn summary," + sgl.gen("summary", max_tokens=16)

    ret = parallel_decoding.run(topic="writing a good blog post", temperature=0.3)
    assert isinstance(ret["summary"], str)


def test_stream(backend) -> None:
    @sgl.function
    def qa(s, question):
        s += sgl.system("You are a helpful assistant.")
        s += sgl.user(question)
        s += sgl.assistant(sgl.gen("answer", max_tokens=16))

    ret = qa(question="Compose a travel post.", stream=True)
    out = "".join(ret.text_iter())
    assert out.endswith(ret["answer"] + backend.chat_template.suffix("assistant"))
    ret = qa(question="Compose a travel post.", stream=True)
    assert "".join(ret.text_iter("answer")) == ret["answer"]
