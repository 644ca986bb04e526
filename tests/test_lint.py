"""The code base stays ruff clean (configured in pyproject.toml)."""

import subprocess
import sys
from pathlib import Path


def test_ruff_clean():
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", str(root)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_ruff_formatted():
    """Line length and layout are the formatter's (`ruff format`, line-length in pyproject.toml)."""
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", str(root)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + "\nrun: ruff format ."
