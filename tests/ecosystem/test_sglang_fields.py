"""docs/sglang_fields.md is current and every field of the installed SGLang's request schemas
has a place in Arbor's (honoured, accepted with no effect, or refused unless default)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_sglang_field_is_listed_and_the_table_is_current():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "sglang_fields.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
