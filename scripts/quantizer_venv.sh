#!/usr/bin/env bash
# Venvs for the quantizers whose checkpoints Arbor loads; each pins an older transformers, so
# they stay outside Arbor's own environment. About 2 minutes each.
#   scripts/quantizer_venv.sh [DIR]            # llmcompressor (benchmarks/quantize.py); DIR default
#                                              # ~/.cache/arbor-peers/llmcompressor
#   scripts/quantizer_venv.sh --autoawq [DIR]  # AutoAWQ 0.2.9 (benchmarks/quantize_awq.py);
#                                              # DIR default ~/.cache/arbor-peers/autoawq
#   scripts/quantizer_venv.sh --gptq [DIR]     # Intel Neural Compressor 3.10's GPTQ, which writes
#                                              # GPTQ's layout on CPUs (benchmarks/quantize_gptq.py);
#                                              # DIR default ~/.cache/arbor-peers/gptq
set -euo pipefail
tool=llmcompressor
case "${1:-}" in
    --autoawq) tool=autoawq; shift ;;
    --gptq) tool=gptq; shift ;;
esac
dir=${1:-$HOME/.cache/arbor-peers/$tool}
mkdir -p "$dir"
[ -x "$dir/venv/bin/python" ] || python3 -m venv "$dir/venv"
if [ "$tool" = llmcompressor ]; then
    "$dir/venv/bin/pip" install -q torch==2.13.0 "llmcompressor==0.14.0.1"
elif [ "$tool" = gptq ]; then
    "$dir/venv/bin/pip" install -q torch==2.13.0 "transformers==4.51.3" "huggingface-hub<1.0" "datasets<4" \
        accelerate safetensors "neural-compressor-pt==3.10"
else
    # AutoAWQ's own pins reach for CUDA wheels; its CPU path needs only these.
    "$dir/venv/bin/pip" install -q torch==2.13.0 "transformers==4.51.3" accelerate datasets safetensors zstandard
    "$dir/venv/bin/pip" install -q --no-deps autoawq==0.2.9
fi
echo "$dir/venv/bin/python"
