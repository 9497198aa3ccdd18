"""Soak test with locust: `python -m bench.soak` -> bench/results/soak.json.

Starts the local app (Ray + Serve on loopback, tiny model), runs the mixed workload of
`bench/locustfile.py` (streamed RAG, streaming-input sessions with random disconnects, OpenAI
chat) with `locust --headless` for a bounded time, then waits for the cluster to drain. The report:
requests and failures per request name, failures by kind, latency percentiles (locust's, ms), and
the cluster at the end (sessions on replicas, in the central scheduler and the ingress store; KV
blocks against the idle level). `leaks` is empty when everything went back to baseline.

Why locust and not the project's own replay (`bench.reliability`): locust is the load generator
operators already run against HTTP services, its users are plain Python a user can edit to their
own traffic, and its report is the familiar one; the replay stays for seeded, trace-driven runs.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

from bench.reliability_drills import drain
from bench.results_meta import engine_dtype, start_run, write_results

RESULTS = Path(__file__).parent / "results" / "soak.json"
LOCUSTFILE = Path(__file__).with_name("locustfile.py")
DTYPE = "bfloat16"  # pinned: the KV bytes below mean the same token count on every CPU


def app_config(model: str, session_ttl_s: float):
    from pipeline.config import AppConfig

    return AppConfig.model_validate({
        "model": {"model": model, "dtype": DTYPE, "max_model_len": 2048, "kv_cache_memory_bytes": 4 << 20},
        "replicas": {"min_replicas": 1, "max_replicas": 2, "num_cpus": 0.5, "report_interval_s": 0.5},
        "limits": {"max_queue": 16, "admission_timeout_s": 30.0, "session_ttl_s": session_ttl_s},
    })


def run_locust(base: str, users: int, spawn_rate: float, duration_s: int, folder: Path, env: dict) -> int:
    """locust --headless in its own process (gevent patches the standard library on import)."""
    command = [str(Path(sys.executable).with_name("locust")), "-f", str(LOCUSTFILE), "--headless", "--host", base,
               "-u", str(users), "-r", str(spawn_rate), "-t", f"{duration_s}s", "--stop-timeout", "30",
               "--csv", str(folder / "soak"), "--only-summary", "--exit-code-on-error", "0"]
    code = subprocess.run(command, env={**os.environ, **env}, timeout=duration_s + 180).returncode
    if not (folder / "soak_stats.csv").is_file():
        raise RuntimeError(f"locust exited with {code} and wrote no report (its output is above)")
    return code


def read_report(folder: Path) -> dict:
    """Requests, failures and percentiles per request name, and failures by kind, from locust's CSVs."""
    with open(folder / "soak_stats.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    by_name = {r["Name"]: {"method": r["Type"], "requests": int(r["Request Count"]), "failures": int(r["Failure Count"]),
                           **{f"p{q}_ms": _number(r.get(f"{q}%")) for q in (50, 95, 99)},
                           "max_ms": _number(r["Max Response Time"])} for r in rows if r["Name"] != "Aggregated"}
    with open(folder / "soak_failures.csv", newline="") as f:
        failures = [{"request": r["Name"], "kind": r["Error"], "count": int(r["Occurrences"])} for r in csv.DictReader(f)]
    total = next((r for r in rows if r["Name"] == "Aggregated"), None)
    return {"requests": int(total["Request Count"]) if total else 0, "failures": int(total["Failure Count"]) if total else 0,
            "by_request": by_name, "failures_by_kind": failures}


def _number(value) -> float | None:
    return None if value in (None, "", "N/A") else float(value)


async def _idle_kv(base: str) -> int:
    async with httpx.AsyncClient(timeout=30) as http:
        return (await http.get(f"{base}/v1/cluster")).json()["pressure"]["kv_blocks_used"]


async def _drain(base: str, idle_kv_blocks: int, timeout_s: float) -> dict:
    async with httpx.AsyncClient(timeout=30) as http:
        return await drain(http, base, idle_kv_blocks, timeout_s)


def run(args) -> dict:
    from pipeline.run.local import local_app

    env = {"SOAK_MAX_TOKENS": str(args.max_tokens), "SOAK_DISCONNECT": str(args.disconnect)}
    with local_app(app_config(args.model, args.session_ttl), num_cpus=args.num_cpus) as base, \
            tempfile.TemporaryDirectory(prefix="stream2llm-soak-") as tmp:
        idle = asyncio.run(_idle_kv(base))
        code = run_locust(base, args.users, args.spawn_rate, args.duration, Path(tmp), env)
        report = read_report(Path(tmp))
        # clients that went away before finishing leave their sessions to the TTL: wait past it
        end = asyncio.run(_drain(base, idle, args.session_ttl + 60))
    leaks = {k: end[k] for k in ("replica_sessions", "scheduler_sessions", "ingress_sessions", "queued") if end.get(k)}
    if end.get("kv_blocks_used", 0) > idle:
        leaks["kv_blocks_above_idle"] = end["kv_blocks_used"] - idle
    return {"locust_exit_code": code, "users": args.users, "duration_s": args.duration, **report,
            "end": end, "leaks": leaks, "drained": bool(end.get("drained"))}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--users", type=int, default=8)
    p.add_argument("--spawn-rate", type=float, default=2.0)
    p.add_argument("--duration", type=int, default=120, help="seconds of load")
    p.add_argument("--max-tokens", type=int, default=12)
    p.add_argument("--disconnect", type=float, default=0.2, help="share of streaming-input clients that leave early")
    p.add_argument("--session-ttl", type=float, default=20.0, help="idle sessions are aborted after this")
    p.add_argument("--model", default="tiny")
    p.add_argument("--num-cpus", type=int, default=None)
    p.add_argument("--out", default=str(RESULTS))
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    meta = start_run(args.model, engine_dtype(DTYPE), seeds=[])
    report = run(args)
    out = write_results(Path(args.out), report, meta)
    print(json.dumps({k: report[k] for k in ("requests", "failures", "failures_by_kind", "leaks", "drained")}, indent=1))
    print(f"wrote {out}")
    return report


if __name__ == "__main__":
    main()
