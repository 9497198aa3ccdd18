"""Run metadata for every results file: what produced a figure, where, and on how busy a machine.

    meta = start_run(model="smollm2", dtype="bfloat16", seeds=[0])   # load average before
    report = run_the_benchmark()
    write_results(Path("bench/results/x.json"), report, meta)        # adds load after, writes JSON

The `meta` block of a results file holds: the git commit (and whether the tree had uncommitted
changes), the command, the start and end dates (UTC, ISO 8601), the machine (CPU cores, CPU model and native bfloat16, GPUs when
`nvidia-smi` lists any, the 1/5/15-minute load average before and after the run, platform), and the
model, dtype and seeds. A file written before this existed carries `meta.missing` instead: the keys
nobody recorded, never reconstructed (`legacy_meta`).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

META_KEY = "meta"
REQUIRED = ("commit", "date_utc", "machine", "model", "dtype", "seeds")
ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_state() -> dict:
    """The checked-out commit and whether tracked files differ from it (None outside a git tree)."""
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"commit": _git("rev-parse", "HEAD"), "dirty": None if status is None else bool(status)}


def _cpu() -> dict:
    """CPU model and whether it computes bfloat16 natively (the CPU engine's speed hinges on it)."""
    from engine.engine_args import cpu_has_native_bf16, cpuinfo_field

    model = cpuinfo_field("model name") or platform.processor() or None
    return {"cpu_model": model, "cpu_bf16": cpu_has_native_bf16()}


def engine_dtype(dtype: str | None) -> str:
    """The dtype an engine asked for `dtype` (None: the platform default) runs in on this machine."""
    from engine.config import EngineConfig
    from engine.engine_args import effective_dtype

    return effective_dtype(EngineConfig(dtype=dtype))


def _gpus() -> list[str]:
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def now_utc() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass
class RunMeta:
    model: str | None
    dtype: str | None
    seeds: list[int]
    command: str
    started_utc: str = field(default_factory=now_utc)
    load_before: list[float] = field(default_factory=lambda: [round(v, 2) for v in os.getloadavg()])

    def finish(self) -> dict:
        """The `meta` block, with the load average now (after the run)."""
        git = git_state()
        return {"commit": git["commit"], "dirty": git["dirty"], "command": self.command,
                "date_utc": now_utc(), "started_utc": self.started_utc,
                "machine": {"cores": os.cpu_count(), **_cpu(), "gpus": _gpus(), "load_avg_before": self.load_before,
                            "load_avg_after": [round(v, 2) for v in os.getloadavg()],
                            "platform": platform.platform(), "python": platform.python_version()},
                "model": self.model, "dtype": self.dtype, "seeds": list(self.seeds)}


def start_run(model: str | None, dtype: str | None, seeds, command: str | None = None) -> RunMeta:
    """Metadata for a run starting now; `command` defaults to this process's command line."""
    if command is None:
        command = " ".join(["python", *sys.orig_argv[1:]])
    return RunMeta(model, dtype, [int(s) for s in seeds], command)


def with_meta(report: dict, meta: RunMeta | dict) -> dict:
    """`report` with the `meta` block first (a finished RunMeta or an already built block)."""
    block = meta.finish() if isinstance(meta, RunMeta) else meta
    return {META_KEY: block, **{k: v for k, v in report.items() if k != META_KEY}}


def write_results(path: Path, report: dict, meta: RunMeta | dict) -> Path:
    """Write `report` with its metadata as indented JSON; the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(with_meta(report, meta), indent=1, ensure_ascii=False, default=str) + "\n",
                    encoding="utf-8")
    return path


def legacy_meta(known: dict, note: str) -> dict:
    """For a file measured before metadata was recorded: what is known from the file itself, and
    the required keys nobody recorded listed under `missing`."""
    return {**known, "missing": [k for k in REQUIRED if known.get(k) is None], "note": note}


def run_number(entry: dict) -> int:
    """The ordinal of a run kept with its `earlier_runs` (newest first) among the runs of its setup.
    Runs written before `run_number` existed count the runs stored with them: none had been
    dropped then."""
    return entry.get("run_number") or 1 + len(entry.get("earlier_runs", []))


def missing_metadata(report: dict) -> list[str]:
    """Required keys a results file lacks (declared as `missing`, or absent).

    A key recorded as null says "not applicable" (a scheduler micro-benchmark runs no model), except
    commit, date and machine, which every run has.
    """
    meta = report.get(META_KEY)
    if not isinstance(meta, dict):
        return list(REQUIRED)
    declared = set(meta.get("missing", []))
    always = ("commit", "date_utc", "machine")
    return [k for k in REQUIRED if k in declared or k not in meta or (k in always and meta[k] is None)]
