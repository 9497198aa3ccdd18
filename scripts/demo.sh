#!/usr/bin/env bash
# Set up (idempotent), then run the main job on embedded defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec "${STREAM2LLM_VENV:-.venv}/bin/stream2llm" demo "$@"
