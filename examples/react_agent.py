"""A ReAct-style tool-using agent: each step the model thinks, then writes a JSON call to one
of the tools with `gen_tool_call` (the arguments always fit the tool's signature, and the
JSON always closes within its token budget), and Python runs it with `call_tool`.
Run against a server:

    arbor serve --port 30000 &
    python examples/react_agent.py --url http://127.0.0.1:30000
"""

from __future__ import annotations

import json

from _cli import connect

import arbor as sgl


def calculate(expression: str) -> str:
    """Add the integers of an expression like 17 + 25."""
    return str(sum(int(t) for t in expression.split("+") if t.strip().isdigit()))


def lookup(term: str) -> str:
    """Look a term up in a small glossary."""
    return {"radix": "a tree keyed by token prefixes"}.get(term.strip().lower(), "no entry")


def finish(answer: str) -> str:
    """Give the final answer."""
    return answer


TOOLS = [calculate, lookup, finish]


@sgl.function
def react(s, question, max_steps=3):
    s += "Answer with Thought / Action / Observation steps. Each action is a JSON call to one of:\n"
    s += "".join(f"- {t.__name__}: {t.__doc__}\n" for t in TOOLS)
    s += "Question: " + question + "\n"
    for i in range(1, max_steps + 1):
        s += f"Thought {i}:" + sgl.gen(f"thought_{i}", max_tokens=16, stop="\n") + "\n"
        s += f"Action {i}: " + sgl.gen_tool_call(f"action_{i}", TOOLS, max_tokens=48) + "\n"
        result = sgl.call_tool(s[f"action_{i}"], TOOLS)
        if json.loads(s[f"action_{i}"])["name"] == "finish":
            s["answer"] = result
            return
        s += f"Observation {i}: {result}\n"
    s += "Final answer:" + sgl.gen("answer", max_tokens=12, stop="\n")


def main() -> None:
    connect(__doc__)
    state = react.run(question="What is 17 + 25?", temperature=0.7)
    print(state.text())
    print("answer:", repr(state["answer"]))


if __name__ == "__main__":
    main()
