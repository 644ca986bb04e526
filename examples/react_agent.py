"""A ReAct-style tool-using agent: the model picks an action with `select`, writes its
argument with `gen(stop=...)`, and Python runs the tool. Run against a server:

    arbor serve --port 30000 &
    python examples/react_agent.py --url http://127.0.0.1:30000
"""

from __future__ import annotations

from _cli import connect

import arbor as sgl

TOOLS = {
    "calculate": lambda arg: str(sum(int(t) for t in arg.split("+") if t.strip().isdigit())),
    "lookup": lambda arg: {"radix": "a tree keyed by token prefixes"}.get(arg.strip().lower(), "no entry"),
}


@sgl.function
def react(s, question, max_steps=3):
    s += "Answer with Thought / Action / Observation steps. Actions: calculate[expr], lookup[term], finish[answer].\n"
    s += "Question: " + question + "\n"
    for i in range(1, max_steps + 1):
        s += f"Thought {i}:" + sgl.gen(f"thought_{i}", max_tokens=16, stop="\n") + "\n"
        s += f"Action {i}: " + sgl.select(f"action_{i}", ["calculate", "lookup", "finish"])
        s += "[" + sgl.gen(f"arg_{i}", max_tokens=12, stop="]") + "]\n"
        action = s[f"action_{i}"]
        if action == "finish":
            s["answer"] = s[f"arg_{i}"]
            return
        s += f"Observation {i}: {TOOLS[action](s[f'arg_{i}'])}\n"
    s += "Final answer:" + sgl.gen("answer", max_tokens=12, stop="\n")


def main() -> None:
    connect(__doc__)
    state = react.run(question="What is 17 + 25?", temperature=0.7)
    print(state.text())
    print("answer:", repr(state["answer"]))


if __name__ == "__main__":
    main()
