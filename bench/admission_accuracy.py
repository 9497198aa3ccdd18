"""Admission accuracy: projected vs real KV per replica under a mixed HTTP load, and the real KV
use when admission first refuses.

    python -m bench.admission_accuracy            # 1 then 2 replicas of the tiny model
    python -m bench.admission_accuracy --quick    # shorter load phase

For each replica count the app runs on loopback (tiny model, `--kv-mib` of KV per replica, the
default scheduler settings: priors, P90 growth, overcommit 2). A mixed load (client streaming
sessions: chunks then a question; /v1/rag over the local crawler site and over the vector index;
OpenAI completions) runs for `--load-s` seconds. Every second the central actor's projection is
snapshotted: per replica, each session's projected final size (`Placement.reserved_blocks`: a
session's learned percentile size, a one-shot request's lease). Once the load has ended, every
snapshot is compared with what the same sessions really held when they ended (the context tokens
of their release; their peak, since this load only appends): per replica and snapshot,
|projected - real| / capacity over the sessions whose end is known (`scheduler.projection_audit`;
replica-snapshots with no such session are left out and counted). That is the projection
admission relies on: what the sessions there will hold. `/v1/cluster` is sampled too, and
|projected_used - kv_blocks_used| / capacity is kept as `projected_vs_used_now_*`: the key this
file had before 2026-12-06 (use now plus the growth still expected, against use now: every
session still growing counts its growth as error).
Then a ramp opens client sessions that each hold one ~1,000-token chunk until one is refused
(429, or 503), and records the real KV fraction of the cluster then, with what refused it: the
real KV room, the projected budget, or the engine's own queue (`first_429_limit`).

Keys (each can fail): `projection_abs_error_p50` <= 0.10 and `projection_abs_error_p95` <= 0.20
(over every compared replica-snapshot of both runs), `real_kv_frac_at_first_429` >= 0.80 (the
lower of the runs) unless the engine's own slot or queue limit came first.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import httpx
import ray

from bench.results_meta import engine_dtype, start_run, write_results
from bench.stats import percentile
from pipeline.config import AppConfig
from pipeline.control.central import NAMESPACE
from pipeline.run.local import local_app
from scheduler.projection_audit import audit_point
from stream2llm.paths import cache_path

RESULTS = Path(__file__).resolve().parent / "results"
TARGETS = {"projection_abs_error_p50": 0.10, "projection_abs_error_p95": 0.20, "real_kv_frac_at_first_429": 0.80}
WORKERS = {"client": 3, "crawler": 1, "vector": 1, "openai": 2}
RAMP_MAX = 400


def vector_index() -> str | None:
    """The vector index in the cache (`stream2llm index` builds one), if any: else vector is a 501."""
    found = sorted(p.parent for p in cache_path("index").glob("*/index.faiss"))
    return str(found[0]) if found else None


def app_config(replicas: int, kv_mib: int) -> AppConfig:
    return AppConfig.model_validate({
        "model": {"model": "tiny", "max_model_len": 8192, "kv_cache_memory_bytes": kv_mib << 20,
                  "answer_budget_tokens": 256},
        "retrievers": {"vector_index": vector_index()},
        "replicas": {"min_replicas": replicas, "max_replicas": replicas, "num_cpus": 1.0 if replicas == 1 else 0.5,
                     "report_interval_s": 0.5},
        "limits": {"admission_timeout_s": 3.0, "session_ttl_s": 600.0, "max_chunks_per_session": 16},
    })


VOCAB = ("the city river capital country people north south history music water market language island "
         "mountain").split()  # one token each for the tiny tokenizer


def words(tag: str, n: int) -> str:
    """About `n` tokens of the tiny tokenizer; the tag first, so sessions share no cached prefix."""
    return f"{tag} " + " ".join(VOCAB[(i * 7) % len(VOCAB)] for i in range(n))


def client_session(c: httpx.Client, i: int) -> int:
    r = c.post("/v1/streams", json={"source_type": "client"})
    if r.status_code != 201:
        return r.status_code
    sid = r.json()["session_id"]
    for j in range(3):
        c.post(f"/v1/streams/{sid}/chunks", json={"text": words(f"c{i}k{j}", 300)})
        time.sleep(0.5)
    return c.post(f"/v1/streams/{sid}/finish", json={"question": "Which?", "stream": False,
                                                       "sampling": {"max_tokens": 8}}).status_code


def rag(c: httpx.Client, source: dict) -> int:
    return c.post("/v1/rag", json={"question": "What is the capital?", "source": source, "stream": False,
                                   "sampling": {"max_tokens": 8}}).status_code


CALLS = {
    "client": client_session,
    "crawler": lambda c, i: rag(c, {"type": "search", "query": "France"}),
    "vector": lambda c, i: rag(c, {"type": "vector", "query": "capital city of a country", "top_k": 4}),
    "openai": lambda c, i: c.post("/v1/completions", json={"model": "stream2llm", "prompt": words(f"o{i}", 600),
                                                         "max_tokens": 8}).status_code,
}


def load(base: str, kind: str, until: float, counts: dict, lock: threading.Lock) -> None:
    i = 0
    with httpx.Client(base_url=base, timeout=120) as c:
        while time.monotonic() < until:
            i += 1
            try:
                status = CALLS[kind](c, f"{kind}{threading.get_ident() % 1000}_{i}")
            except httpx.HTTPError as e:
                status = type(e).__name__
            with lock:
                counts.setdefault(kind, {}).setdefault(str(status), 0)
                counts[kind][str(status)] += 1


def sample(base: str) -> list[dict]:
    view = httpx.get(f"{base}/v1/cluster", timeout=10).json()
    return [{"replica": rid[:8], "real": r["kv_blocks_used"], "projected": r["projected_used"],
             "total": r["kv_blocks_total"], "waiting": r.get("waiting", 0), "max_num_seqs": r.get("max_num_seqs", 0)}
            for rid, r in view["replicas"].items()]


def mixed_load(base: str, central, seconds: float) -> tuple[list[dict], list[float], dict]:
    """Snapshots of the projection and the /v1/cluster gaps, every second while the load runs."""
    counts: dict = {}
    lock = threading.Lock()
    until = time.monotonic() + seconds
    threads = [threading.Thread(target=load, args=(base, kind, until, counts, lock), daemon=True)
               for kind, n in WORKERS.items() for _ in range(n)]
    for t in threads:
        t.start()
    snapshots, gaps = [], []
    start = time.monotonic()
    while time.monotonic() < until:
        snap = ray.get(central.projection_audit.remote(), timeout=30)
        snapshots.append({"t": round(time.monotonic() - start, 1), "replicas": snap})
        gaps += [abs(s["projected"] - s["real"]) / s["total"] for s in sample(base)]
        time.sleep(1.0)
    for t in threads:
        t.join(timeout=180)
    return snapshots, gaps, counts


def audit(central, snapshots: list[dict]) -> dict:
    """Each replica-snapshot's projection against the final sizes its sessions reached; with each
    error, the second of the load it was taken at and the excess blocks per source type (`by_time`:
    which sessions the error comes from, and whether at the cold start, before their source type
    has finished sessions to learn from)."""
    ids = sorted({sid for snap in snapshots for r in snap["replicas"].values() for sid in r["sessions"]})
    finals = ray.get(central.final_sizes.remote(ids), timeout=60)
    points = [(snap["t"], audit_point(r["sessions"], finals, r["kv_blocks_total"], r["block_size"], r["sources"]))
              for snap in snapshots for r in snap["replicas"].values()]
    compared = [(t, p) for t, p in points if p.sessions]
    return {"errors": [p.error for _, p in compared], "replica_snapshots": len(points),
            "left_out_no_known_end": len(points) - len(compared),
            "sessions_compared": sum(p.sessions for _, p in compared),
            "sessions_unresolved": sum(p.unresolved for _, p in compared),
            "projected_over_real": _rounded(sum(p.projected_blocks for _, p in compared)
                                            / max(1, sum(p.real_blocks for _, p in compared))),
            "by_time": [[t, round(p.error, 4), p.projected_blocks, p.real_blocks, p.excess_by_source]
                        for t, p in compared]}


def ramp(base: str) -> dict:
    """Open sessions holding ~1,000 tokens each until one is refused; the state then."""
    opened, refused = [], None
    with httpx.Client(base_url=base, timeout=120) as c:
        for i in range(RAMP_MAX):
            r = c.post("/v1/streams", json={"source_type": "client"})
            if r.status_code != 201:
                refused = {"status": r.status_code, "reason": r.json().get("reason"), "sessions_open": len(opened)}
                break
            opened.append(r.json()["session_id"])
            c.post(f"/v1/streams/{opened[-1]}/chunks", json={"text": words(f"r{i}", 1000)})
        view = c.get("/v1/cluster").json()
        for sid in opened:
            c.delete(f"/v1/streams/{sid}")
    p = view["pressure"]
    saturated = any(r.get("max_num_seqs") and r.get("waiting", 0) >= r["max_num_seqs"] for r in view["replicas"].values())
    limit = ("none (ramp ended)" if refused is None else "engine_queue" if saturated
             else "projected_budget" if p["budget_frac"] >= 0.95 else "real_kv")
    return {"refused": refused, "real_kv_frac": round(p["used_frac"], 4), "budget_frac": round(p["budget_frac"], 4),
            "limit": limit, "pressure": p}


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def run(replicas: int, kv_mib: int, load_s: float) -> dict:
    config = app_config(replicas, kv_mib)
    with local_app(config, address="local", ready_replicas=replicas, ready_timeout_s=600.0) as base:
        central = ray.get_actor(config.scheduler.actor_name, namespace=NAMESPACE)
        snapshots, gaps, counts = mixed_load(base, central, load_s)
        audited = audit(central, snapshots)
        first = ramp(base)
    errors = audited.pop("errors")
    return {"replicas": replicas, "samples": len(errors), "errors": [round(e, 4) for e in errors],
            "gaps": [round(g, 4) for g in gaps],
            "error_p50": _rounded(percentile(errors, 50)), "error_p95": _rounded(percentile(errors, 95)),
            **audited, "projected_vs_used_now_p50": _rounded(percentile(gaps, 50)),
            "projected_vs_used_now_p95": _rounded(percentile(gaps, 95)),
            "requests": counts, "first_refusal": first}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--kv-mib", type=int, default=16, help="KV per replica (16 MiB: 1,024 blocks of 32)")
    parser.add_argument("--load-s", type=float, default=60.0)
    parser.add_argument("--quick", action="store_true", help="20 s of mixed load")
    parser.add_argument("--output", type=Path, default=RESULTS / "admission_accuracy.json")
    args = parser.parse_args(argv)
    meta = start_run(model="tiny", dtype=engine_dtype(None), seeds=[0])
    runs = [run(n, args.kv_mib, 20.0 if args.quick else args.load_s) for n in args.replicas]
    errors = [e for r in runs for e in r["errors"]]
    lowest = min(runs, key=lambda r: r["first_refusal"]["real_kv_frac"])
    engine_limit = lowest["first_refusal"]["limit"] == "engine_queue"
    report = {
        "projection_abs_error_p50": _rounded(percentile(errors, 50)),
        "projection_abs_error_p95": _rounded(percentile(errors, 95)),
        "real_kv_frac_at_first_429": lowest["first_refusal"]["real_kv_frac"],
        "first_429_limit": lowest["first_refusal"]["limit"],
        "projection_definition": ("per replica and snapshot (every second of load): |sum of its sessions' projected "
                                  "final blocks - sum of the blocks they really ended with| / its KV blocks, over "
                                  "the sessions whose end is known"),
        "targets": TARGETS,
        "runs": [{k: v for k, v in r.items() if k not in ("errors", "gaps")} for r in runs],
    }
    gaps = [g for r in runs for g in r["gaps"]]
    report["projected_vs_used_now_p50"] = _rounded(percentile(gaps, 50))  # the key's old definition
    report["projected_vs_used_now_p95"] = _rounded(percentile(gaps, 95))
    report["met"] = {
        "projection_abs_error_p50": report["projection_abs_error_p50"] <= TARGETS["projection_abs_error_p50"],
        "projection_abs_error_p95": report["projection_abs_error_p95"] <= TARGETS["projection_abs_error_p95"],
        "real_kv_frac_at_first_429": (engine_limit or report["real_kv_frac_at_first_429"]
                                      >= TARGETS["real_kv_frac_at_first_429"]),
    }
    write_results(args.output, report, meta)
    for key in ("projection_abs_error_p50", "projection_abs_error_p95", "real_kv_frac_at_first_429",
                "first_429_limit", "met"):
        print(f"{key}: {report[key]}")
    for r in report["runs"]:
        print(f"{r['replicas']} replica(s): {r['samples']} samples, p50 {r['error_p50']}, p95 {r['error_p95']}, "
              f"first refusal {r['first_refusal']['refused']} at real {r['first_refusal']['real_kv_frac']} "
              f"({r['first_refusal']['limit']}), requests {r['requests']}")
    print(f"wrote {args.output}")
    return 0 if all(report["met"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
