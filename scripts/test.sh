#!/usr/bin/env bash
# Set up (idempotent), then run the whole test suite on CPU. GPU-only tests are marked `gpu`
# and deselected here (no GPU on CI); run them on a GPU machine with `-m gpu`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# --durations: the slowest tests are named in every run, so a CI log shows where its time goes.
exec "${STREAM2LLM_VENV:-.venv}/bin/python" -m pytest -m "not gpu" -p no:cacheprovider --durations=25 "$@"
