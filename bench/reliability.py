"""Load and reliability: `python -m bench.reliability` -> bench/results/reliability.json;
`--scale` -> bench/results/reliability_scale.json.

A bounded open-loop load on loopback: sessions sent at seeded Poisson arrival times over a fixed
duration, whatever the answers do. Sources are mixed: /v1/rag with inline `documents`, `corpus` doc
ids and `trace` replays (synthetic crawler and vector traces), and (`streams_share`) streaming-input
sessions whose client sends its own chunks (`bench.reliability_streams`). Faults, each at its moment:
- replica kill: the engine replica holding the most sessions (`recovered`: finished elsewhere);
- ingress kill: one of two ingress replicas; its clients reconnect with Last-Event-ID (`resumed`;
  `took_over` before the answer) or send again a request no ingress took (`retried_unstarted`);
- central restart, shard kill, node removal (`--scale`, `bench.reliability_faults`);
- client disconnects mid-retrieval and mid-answer; their sessions must not leak.
Afterwards the cluster must drain: no sessions, KV back to the idle level, no session records.

Outcomes per session, disjoint: answered, rejected (429), disconnected (left on purpose), lost (no
final event and no error reported, or asked again although a resume was possible:
`bench.reliability_summary`), failed (an error response or error event). `serving`: the `vllm bench
serve` metrics over the sessions not left on purpose. Memory: RSS of this Ray cluster's processes.
The tiny model (random weights) is the default: this checks mechanics, not answer quality.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from bench.http_replay import poll_cluster
from bench.results_meta import engine_dtype, start_run, write_results
from bench.reliability_drills import collect_memory, drain, kill_an_ingress, kill_busiest_replica
from bench.reliability_faults import (ENGINE_RESOURCE, INGRESS_RESOURCE, kill_shard, remove_node, restart_central,
                                      engine_node_cluster)
from bench.reliability_sessions import send_session
from bench.reliability_plan import Planned, plan_sessions
from bench.reliability_summary import summarize

RESULTS = Path(__file__).parent / "results" / "reliability.json"
SCALE_RESULTS = RESULTS.with_name("reliability_scale.json")
SESSION_TTL_S = 60.0  # replicas abort sessions idle this long: the backstop for a leaked session


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
    kill_replica_at_s: float = 0.0     # the replica kill waits until then (and for a second replica)
    restart_central_at_s: float | None = None  # None: no central-actor restart
    kill_shard_at_s: float | None = None       # None: no shard kill
    remove_node_at_s: float | None = None      # None: one node (local Ray); else a head and 2 engine nodes
    replace_node_after_s: float = 5.0  # a fresh node joins this long after the removal
    streams_share: float = 0.0         # fraction of sessions sent through /v1/streams (client-side chunks)
    kv_cache_bytes: int = 2 << 20
    max_queue: int = 8


def scale_spec(**overrides) -> LoadSpec:
    """`--scale`: 200 sessions over 150 s on a head and two engine nodes (one engine replica each), and the
    five faults 20+ s apart: replica kill, ingress kill, central restart, shard kill, node removal."""
    return LoadSpec(**{**dict(sessions=200, duration_s=150.0, min_replicas=2, max_replicas=2, trace_multiplier=3.0,
                              kill_replica_at_s=20.0, kill_deadline_s=20.0, kill_ingress_at_s=45.0,
                              restart_central_at_s=70.0, kill_shard_at_s=95.0, remove_node_at_s=120.0,
                              streams_share=0.3, kv_cache_bytes=8 << 20, max_queue=64,
                              session_timeout_s=240.0, drain_timeout_s=60.0), **overrides})


def app_config(spec: LoadSpec, trace_dir: Path):
    from pipeline.config import AppConfig

    return AppConfig.model_validate({
        # 2 MiB of KV: 4,096 tiny-model tokens per replica in bfloat16 (pinned: with the CPU's default
        # dtype, float32 on AVX2, the same bytes hold half and a 2,048-token context no longer fits)
        "model": {"model": spec.model, "dtype": "bfloat16", "max_model_len": 2048,
                  "kv_cache_memory_bytes": spec.kv_cache_bytes},
        "replicas": {"min_replicas": spec.min_replicas, "max_replicas": spec.max_replicas,
                     **_placement(spec), "report_interval_s": 0.5, "upscale_delay_s": 1.0,
                     "downscale_delay_s": 8.0, "target_kv_frac": 0.5, "sessions_per_replica": 2.0},
        "ingress": {"replicas": spec.ingress_replicas,
                    "resources": {INGRESS_RESOURCE: 0.001} if spec.remove_node_at_s is not None else {}},
        "retrievers": {"trace_dir": str(trace_dir), "trace_multiplier": spec.trace_multiplier},
        "limits": {"max_queue": spec.max_queue, "admission_timeout_s": 30.0, "session_ttl_s": SESSION_TTL_S,
                   "max_context_tokens": 1800},
        # large priors: a replica admits ~3 sessions, so the load queues and the autoscaler adds one
        "scheduler": {"demand_priors": {"client": 2400, "trace": 3200}, "stale_after_s": 3.0},
    })


def _placement(spec: LoadSpec) -> dict:
    """Half a CPU per replica on one node; one replica per engine node (by resource) on a cluster."""
    if spec.remove_node_at_s is None:
        return {"num_cpus": 0.5}
    return {"num_cpus": 0.0, "resources": {ENGINE_RESOURCE: 1}}


async def run_load(base: str, spec: LoadSpec, plans: list[Planned], cluster=None, config=None) -> dict:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(60.0, read=None), limits=limits) as http:
        idle = (await http.get(f"{base}/v1/cluster")).json()["pressure"]
        t0 = time.monotonic()
        stop = asyncio.Event()
        cluster_series = asyncio.create_task(poll_cluster(http, base, stop, t0))
        memory = asyncio.create_task(collect_memory(stop, t0))
        faults = _fault_tasks(http, base, spec, t0, cluster, config)
        try:
            records = await asyncio.gather(*(send_session(http, base, p, t0, spec.session_timeout_s)
                                             for p in plans))
        finally:
            load_s = time.monotonic() - t0
            fired = [await _finish_fault(task, record) for task, record in faults]
            drained = await drain(http, base, idle["kv_blocks_used"], spec.drain_timeout_s)
            if not drained["drained"]:  # a leak: is it freed by the replicas' idle-session TTL?
                drained["after_ttl"] = await drain(http, base, idle["kv_blocks_used"], SESSION_TTL_S + 15)
            stop.set()
            series, mem = await cluster_series, await memory
    return {"records": list(records), "faults": fired, "drain": drained, "series": series, "memory": mem,
            "idle": idle, "load_s": round(load_s, 2),
            "slos_ms": {"ttft": spec.slo_ttft_ms} if spec.slo_ttft_ms else None}


def _fault_tasks(http, base: str, spec: LoadSpec, t0: float, cluster, config) -> list[tuple[asyncio.Task, dict]]:
    """The faults asked for, each a task and the record it fills in as it fires."""
    planned = []
    if spec.kill:
        planned.append(({"fault": "replica_kill"}, lambda r: kill_busiest_replica(
            http, base, t0, spec.kill_deadline_s, r, not_before_s=spec.kill_replica_at_s)))
    if spec.kill_ingress_at_s is not None:
        planned.append(({"fault": "ingress_kill"}, lambda r: kill_an_ingress(t0, spec.kill_ingress_at_s, r)))
    name = config.scheduler.actor_name if config is not None else None
    if spec.restart_central_at_s is not None:
        planned.append(({"fault": "central_restart"}, lambda r: restart_central(name, t0, spec.restart_central_at_s, r)))
    if spec.kill_shard_at_s is not None:
        shards = config.ingress.session_shards
        planned.append(({"fault": "shard_kill"}, lambda r: kill_shard(name, shards, t0, spec.kill_shard_at_s, r)))
    if spec.remove_node_at_s is not None and cluster is not None:
        planned.append(({"fault": "node_removal"}, lambda r: remove_node(
            http, base, cluster, t0, spec.remove_node_at_s, spec.replace_node_after_s, r)))
    return [(asyncio.create_task(start(record)), record) for record, start in planned]


async def _finish_fault(task: asyncio.Task, record: dict) -> dict:
    """The fault's record: awaited when it fired (its timings may still be running), else cancelled."""
    if record.get("fired") or record.get("killed"):
        return {**record, **(await task)}
    return {**record, **(await _outcome_of(task, {"fired": False, "reason": "the load ended first"}))}


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
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(engine_node_cluster()) if spec.remove_node_at_s is not None else None
        base = stack.enter_context(local_app(config, ready_replicas=spec.min_replicas,
                                             address=cluster.address if cluster else None))
        ready = time.monotonic()
        raw = asyncio.run(run_load(base, spec, plans, cluster, config))
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
    p.add_argument("--scale", action="store_true", help="the at-scale drill (`scale_spec`): 200 sessions, two "
                   "nodes, five faults; only --seed, --model, --sessions and --duration apply beside it")
    p.add_argument("--out", default=None, help=f"default {RESULTS.name} ({SCALE_RESULTS.name} with --scale)")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    import tempfile

    args = parse_args(argv)
    spec = scale_spec(sessions=args.sessions if args.sessions != LoadSpec.sessions else 200,
                      duration_s=args.duration if args.duration != LoadSpec.duration_s else 150.0,
                      seed=args.seed, model=args.model) if args.scale else LoadSpec(sessions=args.sessions, duration_s=args.duration, seed=args.seed, model=args.model,
                    kill=args.kill, min_replicas=args.min_replicas, max_replicas=args.max_replicas,
                    kill_deadline_s=args.kill_deadline, slo_ttft_ms=args.slo_ttft,
                    ingress_replicas=args.ingress_replicas, kill_ingress_at_s=args.kill_ingress_at)
    with tempfile.TemporaryDirectory(prefix="stream2llm-traces-") as folder:
        meta = start_run(spec.model, engine_dtype(app_config(spec, Path(folder)).model.dtype), seeds=[spec.seed])
        report = run(spec, Path(folder))
    out = write_results(Path(args.out or (SCALE_RESULTS if args.scale else RESULTS)), report, meta)
    print(json.dumps({k: report[k] for k in ("counts", "recovered", "resumed", "took_over", "reasked", "reask_reasons",
                                              "leaks", "kv_baseline_vs_after", "memory_mb", "replicas", "wall_s")},
                     indent=1, default=str))
    for fault in report["faults"]:
        print(json.dumps({k: v for k, v in fault.items() if k not in ("sessions", "left_routers_s")}, default=str))
    serving = report["serving"]
    print(json.dumps({k: serving[k] for k in ("completed", "median_ttft_ms", "p99_ttft_ms", "median_e2el_ms",
                                              "p99_e2el_ms", "request_goodput")}))
    print(f"wrote {out}")
    return report


if __name__ == "__main__":
    main()
