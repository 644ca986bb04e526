"""The `arbor` command (`python -m arbor`): the runtime's commands plus the DSL's demo.

It sits at the top of the package because `demo` uses every layer; the runtime never
imports the DSL.
"""

from __future__ import annotations

import argparse
import sys

from arbor.frontend_lang import demo
from arbor.runtime import cli


def main(argv: list[str] | None = None) -> int:
    """Parse `argv` and run one command; user-fixable errors print one line and return 2."""
    parser = argparse.ArgumentParser(prog="arbor", description="Arbor: a prefix-sharing LLM runtime.")
    sub = parser.add_subparsers(dest="command", required=True)
    handlers = cli.add_commands(sub) | demo.add_command(sub)
    args = parser.parse_args(argv)
    try:
        return handlers[args.command](args)
    except ValueError as e:
        print(f"arbor: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
