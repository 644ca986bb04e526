"""Type-check the `arbor` package with mypy, configured by pyproject.toml's [tool.mypy].

The repository root is the `arbor` package (pyproject's package-dir), and mypy cannot see
through setuptools' editable finder, so this script names every file's module itself, from
the same package list that setuptools installs. Run: `.venv/bin/python scripts/typecheck.py`.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import tomllib
from mypy import build
from mypy.errors import CompileError
from mypy.main import process_options
from mypy.modulefinder import BuildSource

ROOT = Path(__file__).resolve().parents[1]


def sources() -> list[BuildSource]:
    """Every module of every package that pyproject installs, under its import name."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    out = []
    for package in config["packages"]:
        folder = ROOT.joinpath(*package.split(".")[1:])
        if not (folder / "__init__.py").exists():
            out.append(BuildSource(str(folder), package))  # a namespace package
        for path in sorted(folder.glob("*.py")):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            out.append(BuildSource(str(path), name))
    return out


def check() -> int:
    """Run mypy over the package; print its report and return the exit status."""
    _, options = process_options(["--config-file", str(ROOT / "pyproject.toml")], require_targets=False)
    files = sources()
    start = time.monotonic()
    # mypy puts its working directory first on the import path: from the repository root,
    # `import kernels` would find our folder instead of Hugging Face's distribution.
    with tempfile.TemporaryDirectory() as empty:
        os.chdir(empty)
        try:
            messages = build.build(files, options).errors
        except CompileError as e:
            messages = e.messages
        os.chdir(ROOT)
    messages = [m.removeprefix(f"{ROOT}{os.sep}") for m in messages]
    errors = sum(": error:" in m for m in messages)
    print("\n".join(messages))
    print(
        f"{errors} errors in {len(files)} files ({time.monotonic() - start:.0f} s)"
        if errors
        else f"Success: no issues found in {len(files)} files ({time.monotonic() - start:.0f} s)"
    )
    return 1 if errors else 0


if __name__ == "__main__":
    status = check()
    sys.stdout.flush()
    os._exit(status)  # skips tearing down mypy's object graph, as mypy's own CLI does
