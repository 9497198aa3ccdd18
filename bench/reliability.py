"""Load and reliability: `python -m bench.reliability` -> bench/results/reliability.json.

A bounded open-loop load on loopback with autoscaling on: a fixed number of /v1/rag sessions sent at
seeded Poisson arrival times over a fixed duration, whatever the answers do (open loop), then it
stops. Sources are mixed: inline `documents`, offline `corpus` doc ids and `trace` replays (synthetic
crawler and vector traces written to a temporary trace folder). Under that load, two fault drills:
- replica kill: once the autoscaler has added the second replica (or at a deadline), the engine
  replica holding the most sessions is killed; its sessions must finish elsewhere (`recovered`);
- ingress kill: with two ingress replicas, one is killed halfway through the arrivals; streams it
  carried are resumed with Last-Event-ID (cut mid-answer) or asked again (cut before the answer);
- client disconnects: some clients leave mid-retrieval (after their first context event), some
  mid-answer (after their first token); their sessions must not leak.
Afterwards the cluster must drain: no sessions, KV back to the idle level, no ingress session logs.

Outcomes per session, disjoint: answered (a final event), rejected (429), disconnected (left on
purpose), lost (no final event and no error reported: a stream cut, a transport error or the
client's timeout), failed (an error response or error event). `serving` holds the `vllm bench
serve` metrics over the sessions not left on purpose (`--slo-ttft` for goodput). Memory: RSS of this Ray cluster's processes (the driver's
descendants: raylet, GCS, workers), sampled with the cluster view (GET /v1/cluster) and Serve's
running replica count. The tiny model (random weights) is the default: this checks mechanics,
not answer quality.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from bench.http_replay import poll_cluster, write_request_traces
from bench.results_meta import engine_dtype, start_run, write_results
from bench.reliability_drills import (collect_memory, drain, kill_an_ingress, kill_busiest_replica,
                                      send_session, summarize)
from stream2llm.data.corpus import documents_by_id, load_grounded_questions
from stream2llm.data.traces import poisson_arrivals, synthetic_crawler_traces, synthetic_vector_traces

RESULTS = Path(__file__).parent / "results" / "reliability.json"
SESSION_TTL_S = 60.0  # replicas abort sessions idle this long: the backstop for a leaked session
# Trace shapes scaled to the tiny model's 2,048-token context: a few hundred tokens per chunk.
CRAWLER_SHAPE = dict(mean_scrapes=3, search_s=0.5, search_tokens=120, page_tokens=160,
                     gap_median_s=0.6, gap_mean_s=0.8)
VECTOR_SHAPE = dict(top_k=3, doc_tokens=120, first_s=0.2, slow_gap_median_s=1.0)


@dataclass
class LoadSpec:
    sessions: int = 40
    duration_s: float = 60.0
    seed: int = 0
    model: str = "tiny"
    max_tokens: int = 16
    trace_multiplier: float = 2.0      # slower retrieval: sessions hold KV longer (the paper's pressure knob)
    leave_mid_retrieval: float = 0.1   # fraction of sessions whose client leaves after a context event
    leave_mid_answer: float = 0.1      # ... after its first answer token (those ask for long answers)
    kill: bool = True
    kill_deadline_s: float = 90.0      # until then the kill waits for a second replica; then kills anyway
    ingress_replicas: int = 2
    kill_ingress_at_s: float | None = 30.0  # None: no ingress kill
    min_replicas: int = 1
    max_replicas: int = 2
    drain_timeout_s: float = 20.0
    session_timeout_s: float = 300.0   # a session with no final event by then is given up: lost
    slo_ttft_ms: float | None = None   # request_goodput's TTFT SLO (bench.serving_metrics)


@dataclass
class Planned:
    index: int
    at_s: float
    kind: str          # documents | corpus | crawler | vector
    question: str
    source: dict
    leave_on: str | None  # None | "context" (mid-retrieval) | "token" (mid-answer)
    max_tokens: int


def app_config(spec: LoadSpec, trace_dir: Path):
    from pipeline.config import AppConfig

    return AppConfig.model_validate({
        # 2 MiB of KV: 4,096 tiny-model tokens per replica in bfloat16 (pinned: with the CPU's default
        # dtype, float32 on AVX2, the same bytes hold half and a 2,048-token context no longer fits)
        "model": {"model": spec.model, "dtype": "bfloat16", "max_model_len": 2048, "kv_cache_memory_bytes": 2 << 20},
        "replicas": {"min_replicas": spec.min_replicas, "max_replicas": spec.max_replicas,
                     "num_cpus": 0.5, "report_interval_s": 0.5, "upscale_delay_s": 1.0,
                     "downscale_delay_s": 8.0, "target_kv_frac": 0.5, "sessions_per_replica": 2.0},
        "ingress": {"replicas": spec.ingress_replicas},
        "retrievers": {"trace_dir": str(trace_dir), "trace_multiplier": spec.trace_multiplier},
        "limits": {"max_queue": 8, "admission_timeout_s": 30.0, "session_ttl_s": SESSION_TTL_S,
                   "max_context_tokens": 1800},
        # large priors: a replica admits ~3 sessions, so the load queues and the autoscaler adds one
        "scheduler": {"demand_priors": {"client": 2400, "trace": 3200}, "stale_after_s": 3.0},
    })


def plan_sessions(spec: LoadSpec, trace_dir: Path) -> list[Planned]:
    """Seeded arrivals, sources and disconnect roles; trace files written to `trace_dir`."""
    rng = random.Random(spec.seed)
    arrivals = poisson_arrivals(spec.sessions, spec.sessions / spec.duration_s, spec.seed)
    kinds = [("documents", "corpus", "crawler", "vector")[i % 4] for i in range(spec.sessions)]
    rng.shuffle(kinds)
    crawler = write_request_traces(synthetic_crawler_traces(spec.sessions, spec.seed, **CRAWLER_SHAPE),
                                   trace_dir, "crawler")
    vector = write_request_traces(synthetic_vector_traces(spec.sessions, spec.seed, **VECTOR_SHAPE),
                                  trace_dir, "vector")
    docs = list(documents_by_id().values())
    questions = load_grounded_questions()
    n_retrieval = round(spec.leave_mid_retrieval * spec.sessions)
    n_answer = round(spec.leave_mid_answer * spec.sessions)
    # mid-retrieval leavers need a retrieval that takes a while: trace sources
    slow = [i for i, k in enumerate(kinds) if k in ("crawler", "vector")]
    leave_retrieval = set(rng.sample(slow, min(n_retrieval, len(slow))))
    rest = [i for i in range(spec.sessions) if i not in leave_retrieval]
    leave_answer = set(rng.sample(rest, min(n_answer, len(rest))))
    plans = []
    for i, (at, kind) in enumerate(zip(arrivals, kinds)):
        q = questions[i % len(questions)]
        if kind == "documents":
            source = {"type": "documents", "documents": [d.text for d in rng.sample(docs, 2)]}
        elif kind == "corpus":
            source = {"type": "corpus", "doc_ids": [q.doc_id, rng.choice(docs).doc_id]}
        else:
            name, _ = (crawler if kind == "crawler" else vector)[i]
            source = {"type": "trace", "trace": name}
        leave = "context" if i in leave_retrieval else "token" if i in leave_answer else None
        plans.append(Planned(i, at, kind, q.question, source, leave,
                             64 if leave == "token" else spec.max_tokens))
    return plans


async def run_load(base: str, spec: LoadSpec, plans: list[Planned]) -> dict:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(60.0, read=None), limits=limits) as http:
        idle = (await http.get(f"{base}/v1/cluster")).json()["pressure"]
        t0 = time.monotonic()
        stop = asyncio.Event()
        cluster = asyncio.create_task(poll_cluster(http, base, stop, t0))
        memory = asyncio.create_task(collect_memory(stop, t0))
        kill_record: dict = {}
        kill = asyncio.create_task(kill_busiest_replica(http, base, t0, spec.kill_deadline_s, kill_record)
                                   if spec.kill else asyncio.sleep(0, {"killed": False}))
        ingress_record: dict = {}
        ingress_kill = (asyncio.create_task(kill_an_ingress(t0, spec.kill_ingress_at_s, ingress_record))
                        if spec.kill_ingress_at_s is not None else None)
        try:
            records = await asyncio.gather(*(send_session(http, base, p, t0, spec.session_timeout_s)
                                             for p in plans))
        finally:
            load_s = time.monotonic() - t0
            killed = await kill if kill_record else await _outcome_of(kill, {"killed": False, "reason": (
                "the load ended first: no second replica and no deadline reached while a replica held a session")})
            ingress_killed = {"killed": False} if ingress_kill is None else (
                await ingress_kill if ingress_record else await _outcome_of(
                    ingress_kill, {"killed": False, "reason": "the load ended before the kill time"}))
            drained = await drain(http, base, idle["kv_blocks_used"], spec.drain_timeout_s)
            if not drained["drained"]:  # a leak: is it freed by the replicas' idle-session TTL?
                drained["after_ttl"] = await drain(http, base, idle["kv_blocks_used"], SESSION_TTL_S + 15)
            stop.set()
            series, mem = await cluster, await memory
    return {"records": list(records), "kill": killed, "ingress_kill": ingress_killed, "drain": drained, "series": series, "memory": mem,
            "idle": idle, "load_s": round(load_s, 2),
            "slos_ms": {"ttft": spec.slo_ttft_ms} if spec.slo_ttft_ms else None}


async def _outcome_of(task: asyncio.Task, if_cancelled: dict) -> dict:
    task.cancel()  # no-op when it already finished
    try:
        return await task
    except asyncio.CancelledError:
        return if_cancelled


def run(spec: LoadSpec, trace_dir: Path) -> dict:
    from pipeline.run.local import local_app

    plans = plan_sessions(spec, trace_dir)
    config = app_config(spec, trace_dir)
    started = time.monotonic()
    with local_app(config, ready_replicas=spec.min_replicas) as base:
        ready = time.monotonic()
        raw = asyncio.run(run_load(base, spec, plans))
    report = summarize(raw, plans)
    report["spec"] = asdict(spec)
    report["app"] = config.model_dump(include={"model", "replicas", "limits", "ingress"})
    report["wall_s"] = {"startup": round(ready - started, 1), "load_and_drills": round(time.monotonic() - ready, 1)}
    return report


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    d = LoadSpec()
    p.add_argument("--sessions", type=int, default=d.sessions)
    p.add_argument("--duration", type=float, default=d.duration_s, help="seconds over which sessions arrive")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--model", default=d.model)
    p.add_argument("--no-kill", dest="kill", action="store_false", help="skip the replica-kill drill")
    p.add_argument("--min-replicas", type=int, default=d.min_replicas)
    p.add_argument("--max-replicas", type=int, default=d.max_replicas)
    p.add_argument("--kill-deadline", type=float, default=d.kill_deadline_s,
                   help="seconds into the load by which the kill drill fires even with one replica")
    p.add_argument("--ingress-replicas", type=int, default=d.ingress_replicas)
    p.add_argument("--kill-ingress-at", type=float, default=d.kill_ingress_at_s, metavar="S",
                   help="seconds into the load at which one ingress replica is killed")
    p.add_argument("--no-ingress-kill", dest="kill_ingress_at", action="store_const", const=None,
                   help="skip the ingress-kill drill")
    p.add_argument("--slo-ttft", type=float, default=None, metavar="MS", help="TTFT SLO (ms) for request_goodput")
    p.add_argument("--out", default=str(RESULTS))
    return p.parse_args(argv)


def main(argv=None) -> dict:
    import tempfile

    args = parse_args(argv)
    spec = LoadSpec(sessions=args.sessions, duration_s=args.duration, seed=args.seed, model=args.model,
                    kill=args.kill, min_replicas=args.min_replicas, max_replicas=args.max_replicas,
                    kill_deadline_s=args.kill_deadline, slo_ttft_ms=args.slo_ttft,
                    ingress_replicas=args.ingress_replicas, kill_ingress_at_s=args.kill_ingress_at)
    with tempfile.TemporaryDirectory(prefix="stream2llm-traces-") as folder:
        meta = start_run(spec.model, engine_dtype(app_config(spec, Path(folder)).model.dtype), seeds=[spec.seed])
        report = run(spec, Path(folder))
    out = write_results(Path(args.out), report, meta)
    print(json.dumps({k: report[k] for k in ("counts", "recovered", "resumed", "reasked", "kill", "ingress_kill", "leaks", "memory_mb", "replicas",
                                              "wall_s")}, indent=1))
    serving = report["serving"]
    print(json.dumps({k: serving[k] for k in ("completed", "median_ttft_ms", "p99_ttft_ms", "median_e2el_ms",
                                              "p99_e2el_ms", "request_goodput")}))
    print(f"wrote {out}")
    return report


if __name__ == "__main__":
    main()
