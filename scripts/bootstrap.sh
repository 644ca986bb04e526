#!/usr/bin/env bash
# Create .venv and install Arbor with its test, bench and ecosystem extras, then the unmodified
# sglang frontend (--no-deps: its own requirements pin a CUDA torch; the extra carries what it
# imports). When the venv has no torch yet, install the CPU build (torch==2.13.0) first, so
# pip never pulls a multi-GB CUDA build on a machine without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    .venv/bin/python -m pip install -q "torch==2.13.0"
fi
.venv/bin/python -m pip install -q -e ".[test,bench,ecosystem]"
# pip then lists sglang's uninstalled CUDA-only requirements as "conflicts"; that is expected.
.venv/bin/python -m pip show sglang >/dev/null 2>&1 || .venv/bin/python -m pip install -q --no-deps "sglang==0.5.23"
