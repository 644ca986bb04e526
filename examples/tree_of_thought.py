"""Tree of thought with fork/join: propose several thoughts, expand each into branches,
score every leaf with `select`, keep the best. Every branch shares the question's KV.

    python examples/tree_of_thought.py --url http://127.0.0.1:30000
"""

from __future__ import annotations

from _cli import connect

import arbor as sgl


@sgl.function
def tree_of_thought(s, question, width=3, depth=2):
    s += "Question: " + question + "\n"
    leaves = []
    level = [s]
    for d in range(depth):
        nxt = []
        for node in level:
            forks = node.fork(width)
            forks += lambda i, d=d: (
                f"Step {d + 1}, option {i + 1}:" + sgl.gen("thought", max_tokens=12, stop="\n") + "\n"
            )
            forks.join()
            nxt.extend(forks)
        level = nxt
    for leaf in level:
        leaf += "Is this reasoning sound? " + sgl.select("verdict", ["yes", "no"])
        leaves.append(leaf)
    best = next((leaf for leaf in leaves if leaf["verdict"] == "yes"), leaves[0])
    s["best"] = best.text()[len("Question: " + question + "\n") :]
    s["leaves"] = len(leaves)


def main() -> None:
    connect(__doc__)
    state = tree_of_thought.run(question="How many legs do 3 spiders have?", temperature=0.8)
    print(f"{state['leaves']} leaves; best path:\n{state['best']}")


if __name__ == "__main__":
    main()
