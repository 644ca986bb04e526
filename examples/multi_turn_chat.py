"""A multi-turn chat: each turn appends to one conversation, so every turn's prompt hits the
KV of all earlier turns (cached_tokens grows turn by turn).

    python examples/multi_turn_chat.py --url http://127.0.0.1:30000
"""

from __future__ import annotations

from _cli import connect

import arbor as sgl


@sgl.function
def chat(s, questions):
    s += sgl.system("You are a concise assistant.")
    for i, q in enumerate(questions):
        s += sgl.user(q)
        s += sgl.assistant(sgl.gen(f"answer_{i}", max_tokens=24))


def main() -> None:
    connect(__doc__)
    questions = ["What is a radix tree?", "Why share prefixes?", "And with many users?", "Summarize."]
    state = chat.run(questions=questions, temperature=0.7)
    for i, q in enumerate(questions):
        meta = state.get_meta_info(f"answer_{i}")
        print(
            f"user: {q}\nassistant: {state[f'answer_{i}']!r}  "
            f"(prompt {meta['prompt_tokens']} tokens, {meta['cached_tokens']} cached)"
        )


if __name__ == "__main__":
    main()
