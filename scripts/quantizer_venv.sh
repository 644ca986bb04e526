#!/usr/bin/env bash
# A venv with llmcompressor, the quantizer whose checkpoints Arbor loads (benchmarks/quantize.py).
# It pins transformers <= 5.17, so it stays outside Arbor's own environment. About 2 minutes.
#   scripts/quantizer_venv.sh [DIR]     # default ~/.cache/arbor-peers/llmcompressor
set -euo pipefail
dir=${1:-$HOME/.cache/arbor-peers/llmcompressor}
mkdir -p "$dir"
[ -x "$dir/venv/bin/python" ] || python3 -m venv "$dir/venv"
"$dir/venv/bin/pip" install -q torch==2.13.0 "llmcompressor==0.14.0.1"
echo "$dir/venv/bin/python"
