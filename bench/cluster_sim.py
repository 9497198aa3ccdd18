"""Cluster-scale simulation: the central scheduler's real admission code against Ray Serve's default
router (power of two choices), round-robin and session affinity alone.

    python -m bench.cluster_sim            # the full grid (about 5 minutes on 2 busy cores)
    python -m bench.cluster_sim --quick    # a small grid (a test runs it)

Every cell replays the same sessions through simulated engines (`scheduler.simulator`: the real
policies and planner, H200 cost model) behind each router (`scheduler.simulator.routers`). The
central router runs `scheduler.admission.AdmissionController` with the central actor's settings
(`pipeline.config`), fed by replica reports every `report_interval_s` (stale in between).

Load is a fraction of KV capacity by Little's law: a replica holds `kv_blocks x block_size`
tokens, a session holds its context from each chunk's arrival to its answer's end (the answer
priced as one-sequence decode steps), so a replica's capacity is its KV tokens over a session's
mean token-seconds, in sessions per second. `bench/results/cluster_sim.json`: P50/P99 TTFT,
goodput at the TTFT SLO and preemptions per router and cell, and `central_vs_pow2_p99_ratio_64_at_80`
(the worst cell over shapes and arrivals at 64 replicas and 80% load; target <= 0.5).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

from bench.results_meta import start_run, write_results
from bench.stats import percentile
from engine.config import EngineConfig
from pipeline.config import ReplicaSettings, SchedulerSettings
from scheduler.gpu_model import PRESETS
from scheduler.simulator import SimConfig, SimEngineConfig, simulate
from stream2llm.data.traces import ContextOp, PromptMode, synthetic_crawler_traces, synthetic_vector_traces

ROUTERS = ("central", "pow2", "round_robin", "affinity")
SHAPES = ("crawler", "vector", "mixed")
ARRIVALS = ("poisson", "bursty")
LOADS = (0.6, 0.8, 0.95)
REPLICAS = (8, 16, 64)
KV_BLOCKS, BLOCK_SIZE = 4096, 16     # 64k tokens per replica: memory, not compute, is contended
TTFT_SLO_S = 1.0
RATIO_TARGET = 0.5
FAST_REPORT_S = 0.05
OUTPUT = Path("bench/results/cluster_sim.json")


def make_traces(shape: str, n: int, seed: int) -> list:
    if shape == "crawler":
        return synthetic_crawler_traces(n, seed)
    if shape == "vector":
        return synthetic_vector_traces(n, seed)
    pick = np.random.default_rng(seed).random(n) < 0.5
    crawler, vector = synthetic_crawler_traces(n, seed), synthetic_vector_traces(n, seed + 1)
    return [c if p else v for c, v, p in zip(crawler, vector, pick)]


def token_seconds(trace, cost) -> float:
    """KV tokens x seconds a session holds, from its first chunk to its answer's end."""
    answer_s = trace.output_tokens * cost.step_s(0, 0, 1, trace.total_context_tokens(), 0)
    end = trace.events[-1].end_s + answer_s
    held, total = 0, 0.0
    for event, following in zip(trace.events, trace.events[1:] + (None,)):
        held = held + event.num_tokens if event.kind == ContextOp.APPEND else event.num_tokens
        until = following.end_s if following is not None else end
        total += held * (until - event.end_s)
    return total


def capacity_per_replica(traces, cost) -> float:
    """Sessions/s one replica's KV sustains (Little's law)."""
    return KV_BLOCKS * BLOCK_SIZE / float(np.mean([token_seconds(t, cost) for t in traces]))


def router_settings(seed: int, replicas: int) -> dict:
    sched, replica = SchedulerSettings(), ReplicaSettings()
    return {"seed": seed, "report_interval_s": replica.report_interval_s, "priors": dict(sched.demand_priors),
            "overcommit": sched.overcommit, "stale_after_s": sched.stale_after_s,
            "reserve_frac": sched.reserve_frac, "growth_percentile": sched.growth_percentile,
            "grace_s": sched.grace_s, "max_ongoing_requests": replica.max_ongoing_requests,
            "routers": pow2_routers(replicas)}


def pow2_routers(replicas: int) -> int:
    """Router instances sharing the traffic: one per 8 replicas (a Serve proxy per 8-GPU node)."""
    return max(1, replicas // 8)


def run_cell(traces, cost, replicas: int, qps: float, arrivals: str, seed: int) -> dict:
    engine = SimEngineConfig(KV_BLOCKS, BLOCK_SIZE)
    out = {}
    for router in ROUTERS:
        config = SimConfig(EngineConfig().policy, PromptMode.STREAM, engine, replicas, qps, seed,
                           router=router, router_settings=router_settings(seed, replicas), arrivals=arrivals)
        result = simulate(traces, config, cost)
        ttft, waits = np.asarray(result.ttft_s), result.extra["queue_waits_s"]
        out[router] = {"ttft_p50_s": float(percentile(ttft, 50)), "ttft_p99_s": float(percentile(ttft, 99)),
                       "goodput_frac": float(np.mean(ttft <= TTFT_SLO_S)),
                       "goodput_qps": float(np.mean(ttft <= TTFT_SLO_S)) * qps,
                       "preemptions": sum(result.preemptions.values()), "sessions": len(ttft),
                       "queued_frac": len(waits) / len(ttft),
                       "queue_wait_p99_s": float(percentile(waits, 99)) if waits else 0.0,
                       **result.extra["router"], "wall_s": round(result.wall_s, 2)}
    return out


def sessions_for(replicas: int, per_replica: int, floor: int) -> int:
    return max(floor, per_replica * replicas)


def run_grid(replicas_list, shapes, arrivals_list, loads, per_replica: int, floor: int, seed: int,
             echo=print) -> dict:
    cost = PRESETS["h200"]()
    cells = {}
    for replicas in replicas_list:
        n = sessions_for(replicas, per_replica, floor)
        for shape in shapes:
            traces = make_traces(shape, n, seed)
            capacity = capacity_per_replica(traces, cost) * replicas
            for arrivals in arrivals_list:
                for load in loads:
                    key = f"{replicas}/{shape}/{arrivals}/{load:g}"
                    cell = run_cell(traces, cost, replicas, load * capacity, arrivals, seed)
                    cells[key] = {"replicas": replicas, "shape": shape, "arrivals": arrivals, "load": load,
                                  "qps": load * capacity, "sessions": n, "routers": cell}
                    echo(f"{key:28s} " + "  ".join(f"{r} p99 {c['ttft_p99_s']:.3f}" for r, c in cell.items()))
    return cells


def headline(cells: dict, replicas: int = 64, load: float = 0.8) -> dict:
    """Central / pow2 P99 TTFT per cell at `replicas` and `load`, and the worst of them."""
    ratios = {k: c["routers"]["central"]["ttft_p99_s"] / c["routers"]["pow2"]["ttft_p99_s"]
              for k, c in cells.items() if c["replicas"] == replicas and math.isclose(c["load"], load)}
    return {"per_cell": ratios, "worst": max(ratios.values()) if ratios else None}


def summarize(cells: dict, replicas_list) -> dict:
    top = max(replicas_list)
    head = headline(cells, top, 0.8)
    worst = head["worst"]
    report = {"central_vs_pow2_p99_ratio_64_at_80": worst if top == 64 else None,
              "central_vs_pow2_p99_ratio_by_cell": head["per_cell"],
              "headline_replicas": top,
              "targets": {"central_vs_pow2_p99_ratio_64_at_80": RATIO_TARGET},
              "met": None if worst is None or top != 64 else worst <= RATIO_TARGET}
    if report["met"] is False:
        report["why_missed"] = why_missed(cells, head)
    return report


def why_missed(cells: dict, head: dict) -> dict:
    """The cells that miss, what the central router did in them, and what would reach the target."""
    missing = {k: r for k, r in head["per_cell"].items() if r > RATIO_TARGET}
    central = {k: cells[k]["routers"]["central"] for k in missing}
    return {
        "cells_over_target": missing,
        "central_in_those_cells": {k: {f: c[f] for f in ("queued_frac", "queue_wait_p99_s", "preemptions",
                                                           "most_placed_between_reports")}
                                   for k, c in central.items()},
        "reason": ("The central controller places sessions in turn among replicas with a quarter of their KV free "
                   "(least recently placed first) and by most room below that (scheduler.replica_index). Between "
                   "two reports it sees a replica's placements but not its engine's prefill queue, so a replica "
                   "that is slow to drain keeps its turn: up to `most_placed_between_reports` sessions landed on "
                   "one replica between two of its reports. `central_p99_with_fast_reports_s` reran those cells "
                   f"with reports every {FAST_REPORT_S} s."),
        "what_would_reach_it": ("Tried at 64 replicas and 80% load and not kept: ranking by KV room alone (vector "
                                "0.62 and 0.70 of pow2's P99); room in steps of 1/8, 1/4 or 1/2 of the capacity, "
                                "least recently placed first within a step (vector 0.51 to 0.61); in turn whatever "
                                "the room (vector 0.47 and 0.46, but crawler P99 2.7 and 4.8 times that of ranking "
                                "by room); in turn only above half the capacity free (vector 0.68 and 0.67). "
                                "Untested: a prefill-queue signal in the reports (what the engine still has to "
                                "prefill, in tokens)."),
    }


def fast_report_check(cells: dict, keys, seed: int) -> dict:
    """The central router's P99 TTFT in `keys`' cells with reports every FAST_REPORT_S seconds."""
    cost, out = PRESETS["h200"](), {}
    for key in keys:
        cell = cells[key]
        traces = make_traces(cell["shape"], cell["sessions"], seed)
        settings = {**router_settings(seed, cell["replicas"]), "report_interval_s": FAST_REPORT_S}
        config = SimConfig(EngineConfig().policy, PromptMode.STREAM, SimEngineConfig(KV_BLOCKS, BLOCK_SIZE),
                           cell["replicas"], cell["qps"], seed, router="central", router_settings=settings,
                           arrivals=cell["arrivals"])
        out[key] = float(percentile(simulate(traces, config, cost).ttft_s, 99))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 and 64 replicas, mixed, Poisson, 80%%, few sessions")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sessions-per-replica", type=int, default=20)
    parser.add_argument("--min-sessions", type=int, default=600)
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    if args.quick:
        grid = dict(replicas_list=(8, 64), shapes=("mixed",), arrivals_list=("poisson",), loads=(0.8,),
                    per_replica=3, floor=80)
    else:
        grid = dict(replicas_list=REPLICAS, shapes=SHAPES, arrivals_list=ARRIVALS, loads=LOADS,
                    per_replica=args.sessions_per_replica, floor=args.min_sessions)
    meta = start_run(model="simulated Llama-3.1-8B on H200 (scheduler.gpu_model)", dtype="n/a (simulated)",
                     seeds=[args.seed], command=" ".join(["python -m bench.cluster_sim", *(argv or sys.argv[1:])]))
    cells = run_grid(seed=args.seed, **grid)
    summary = summarize(cells, grid["replicas_list"])
    if summary["met"] is False:
        why = summary["why_missed"]
        why["central_p99_with_fast_reports_s"] = fast_report_check(cells, why["cells_over_target"], args.seed)
    report = {"quick": args.quick, "routers": list(ROUTERS), "ttft_slo_s": TTFT_SLO_S,
              "kv_blocks_per_replica": KV_BLOCKS, "block_size": BLOCK_SIZE,
              "sessions_per_cell": f"max({grid['floor']}, {grid['per_replica']} x replicas)",
              "load_definition": "qps / (replicas x KV tokens / mean session token-seconds), Little's law",
              "pow2_router_instances": "max(1, replicas // 8): one Serve proxy per 8-GPU node",
              "cells": cells, **summary}
    write_results(args.output, report, meta)
    print(f"central / pow2 P99 TTFT, worst cell at {report['headline_replicas']} replicas and 80%: "
          f"{report['central_vs_pow2_p99_ratio_by_cell'] and max(report['central_vs_pow2_p99_ratio_by_cell'].values()):.3f}"
          f" (target <= {RATIO_TARGET}); wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
