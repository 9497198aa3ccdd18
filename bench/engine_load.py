"""The real engine under load: every policy streaming, and the one-shot baseline, over a QPS sweep.

    python -m bench.engine_load [--quick] [--qps Q ..] [--seeds S ..] [--sessions N] [--delay X]
        ->  bench/results/engine_load.json

One vLLM engine per policy (SmolLM2 on this CPU; its KV cache a fraction of what the concurrent
streams hold at the higher levels), all five up for the whole sweep, replays crawler-shaped
sessions scaled to this CPU (a search chunk and a few page chunks of ~70-200 tokens, the paper's
gap distribution, time-compressed by `--delay`) with Poisson arrivals, at each QPS level and seed:
chunks appended as they arrive, the question with the last one. Each (qps, seed) cell is replayed
by every (policy, mode) in turn before the next cell (`run_cells`, recorded as `replay_order`).
The one-shot baseline sends the whole prompt when the last chunk arrives (on the default_vllm
engine, no prefix reuse). TTFT counts from the moment the question is handed over, E2E from then
to the last token.

Per (policy, mode, qps, seed): ttft_p50_s, ttft_p95_s, ttft_p99_s, e2e_p50_s, e2e_p99_s,
makespan_s, preemptions, tokens_recomputed, plus `serving` (the `vllm bench serve` keys of
bench.serving_metrics over the same requests). Summary:
- stream_vs_oneshot_worst_ratio: worst TailGuard-stream / one-shot TTFT over levels and P50/P95/P99
  (target <= 1.0), each cell the median over seeds of the per-seed ratio (`paired_ratio`);
- stream_vs_oneshot_worst_ratio_of_medians: the same cells as median TailGuard TTFT over median
  one-shot TTFT (reported, no target; the definition of runs before it);
- stream_vs_oneshot_worst_seed_ratio: the worst per-seed ratio of any cell (reported, no target):
  what a median over three seeds hides;
- light_load_speedup_p50: one-shot / TailGuard-stream P50 at the lightest level, paired the same
  way (target >= 3);
- tailguard_lowest_p99: TailGuard's P99 the lowest of the five policies at the two highest levels
  on at least 2 of the seeds.
A seed fixes the sessions and their arrivals, so both modes of one seed replay the same workload:
the per-seed ratio compares like with like. The seeds' loads differ severalfold at the top levels
(one seed's P50 can be five times another's), so a median taken per mode may come from different
seeds for the two modes, and their ratio then compares two workloads.
Figures on a shared 2-core machine are noisy: the load average before and after is recorded.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

import numpy as np

from bench.engine_policies import SHAPE, make_traces
from bench.engine_replay import replay
from bench.engine_sizing import kv_bytes
from bench.results_meta import engine_dtype, start_run, write_results
from bench.serving_metrics import RequestRecord, serving_metrics
from bench.stats import percentile
from engine.config import DEFAULT_MODEL, EngineConfig
from stream2llm.data.traces import PromptMode, poisson_arrivals
from scheduler.policies import POLICIES

RESULTS = Path(__file__).parent / "results" / "engine_load.json"
ONE_SHOT_ENGINE = "default_vllm"  # complete requests only: the order barely matters
# Runs written before `run_cells` have no `replay_order`: each engine swept every cell in turn.
REPLAY_ORDER_INTERLEAVED, REPLAY_ORDER_PER_ENGINE = "cells interleaved", "engine by engine"
KEYS = ("ttft_p50_s", "ttft_p95_s", "ttft_p99_s", "e2e_p50_s", "e2e_p99_s", "makespan_s",
        "preemptions", "tokens_recomputed")
FULL = dict(qps=(0.25, 0.5, 1.0, 2.0, 4.0), seeds=(0, 1, 2), sessions=16, delay=0.5)
# Under 5 minutes on 2 cores, engine start-ups (~25 s each, five engines) included: the same keys
# from 2 seeds of 3 sessions (not seed 1: its arrivals at the lightest level span 14 s, which alone
# took the run to 6 minutes).
QUICK = dict(qps=(0.5, 1.0, 2.0, 4.0), seeds=(0, 2), sessions=3, delay=0.2)


def run_key(summary: dict) -> dict:
    e2e = summary["e2e_s"]
    row = {k: summary[k] for k in KEYS if k in summary}
    row["e2e_p50_s"], row["e2e_p99_s"] = percentile(e2e, 50), percentile(e2e, 99)
    records = [RequestRecord(0.0, t, e, n) for t, e, n in zip(summary["ttft_s"], e2e, summary["output_tokens"])]
    row["serving"] = serving_metrics(records, summary["makespan_s"])
    return row


async def start_engine(args, policy: str):
    from engine.vllm_engine import create_engine

    return await create_engine(EngineConfig(
        model=args.model, max_model_len=args.max_model_len, kv_cache_memory_bytes=args.kv_bytes,
        max_num_seqs=64, max_num_batched_tokens=args.max_num_batched_tokens,
        answer_budget_tokens=SHAPE["output_tokens"], policy=policy, dtype=args.dtype))


def run_order() -> list[tuple[str, str]]:
    """Every (policy, mode) replayed in each cell: the policies streaming, and the one-shot baseline."""
    return [(policy, mode) for policy in POLICIES
            for mode in (tuple(PromptMode) if policy == ONE_SHOT_ENGINE else (PromptMode.STREAM,))]


def rotated(order: list, cell: int) -> list:
    """The cell's replay order: the start moves by one each cell, so no (policy, mode) always runs
    first or last in its cell."""
    start = cell % len(order)
    return order[start:] + order[:start]


async def run_cells(args, engines: dict) -> dict:
    """Each (qps, seed) cell is replayed by every (policy, mode) back to back before the next cell.
    The comparisons of the summary are within a cell, so they are measured minutes apart, not the
    tens of minutes between one engine's sweep and the next, over which a shared machine drifts."""
    rows: dict = {}
    order = run_order()
    cells = [(level, qps, seed) for level, qps in enumerate(args.qps) for seed in args.seeds]
    for cell, (level, qps, seed) in enumerate(cells):
        traces = make_traces(args.sessions, seed, args.delay)
        arrivals = poisson_arrivals(len(traces), qps, seed)
        for policy, mode in rotated(order, cell):
            # distinct prompts per level: no prefix-cache hits from an earlier level's run
            summary = await replay(engines[policy], traces, arrivals, mode == PromptMode.STREAM,
                                   seed=seed * 100 + level)
            rows.setdefault(policy, {}).setdefault(mode, {}).setdefault(str(qps), {})[str(seed)] = run_key(summary)
            print(f"{policy:13s} {mode:8s} qps {qps:5.2f} seed {seed}: "
                  f"p50 {summary['ttft_p50_s']:.3f} p99 {summary['ttft_p99_s']:.3f} s "
                  f"preempt {summary['preemptions']}", flush=True)
    return rows


def _median(runs: dict, qps: str, key: str) -> float:
    return float(np.median([row[key] for row in runs[qps].values()]))


def seed_ratios(top: dict, bottom: dict, qps: str, key: str) -> list[float]:
    """top / bottom for each seed (the same sessions and arrivals in both)."""
    return [top[qps][seed][key] / bottom[qps][seed][key] for seed in top[qps]]


def paired_ratio(top: dict, bottom: dict, qps: str, key: str) -> float:
    """Median over seeds of the per-seed ratio."""
    return float(np.median(seed_ratios(top, bottom, qps, key)))


def summarize(results: dict, levels: list[str], seeds: list[str]) -> dict:
    stream, one = results["tailguard"][PromptMode.STREAM], results[ONE_SHOT_ENGINE][PromptMode.ONESHOT]
    cells = [(q, f"ttft_p{p}_s", f"{q}/p{p}") for q in levels for p in (50, 95, 99)]
    ratios = {name: paired_ratio(stream, one, q, key) for q, key, name in cells}
    of_medians = {name: _median(stream, q, key) / _median(one, q, key) for q, key, name in cells}
    lowest = {}
    for q in levels[-2:]:
        wins = sum(stream[q][s]["ttft_p99_s"]
                   <= min(results[p][PromptMode.STREAM][q][s]["ttft_p99_s"] for p in POLICIES) for s in seeds)
        lowest[q] = wins
    need = min(2, len(seeds))
    return {"stream_vs_oneshot_ratios": ratios, "stream_vs_oneshot_worst_ratio": max(ratios.values()),
            "stream_vs_oneshot_worst_ratio_of_medians": max(of_medians.values()),
            "stream_vs_oneshot_worst_seed_ratio": max(max(seed_ratios(stream, one, q, key)) for q, key, _ in cells),
            "light_load_speedup_p50": paired_ratio(one, stream, levels[0], "ttft_p50_s"),
            "tailguard_p99_lowest_seeds": lowest, "tailguard_lowest_p99": all(w >= need for w in lowest.values()),
            "targets": {"stream_vs_oneshot_worst_ratio": "<= 1.0", "light_load_speedup_p50": ">= 3",
                        "tailguard_lowest_p99": True}}


async def main_async(args) -> dict:
    # All engines stay up for the whole sweep; an idle vLLM engine takes no CPU.
    engines = {}
    try:
        for policy in POLICIES:
            engines[policy] = await start_engine(args, policy)
        return await run_cells(args, engines)
    finally:
        await asyncio.gather(*(engine.shutdown() for engine in engines.values()))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 sessions per run, 2 seeds, shorter gaps")
    parser.add_argument("--qps", type=float, nargs="+", help="QPS levels, lightest first (overrides the size's)")
    parser.add_argument("--seeds", type=int, nargs="+", help="trace seeds (overrides the size's)")
    parser.add_argument("--sessions", type=int, help="sessions per run (overrides the size's)")
    parser.add_argument("--delay", type=float, help="time compression of the chunk gaps (overrides the size's)")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), help="default: the engine's for this machine")
    parser.add_argument("--kv-bytes", type=int, help="KV cache per engine (default: 40 MiB in bfloat16, "
                        "~1,800 SmolLM2 tokens, scaled to the dtype)")
    parser.add_argument("--max-model-len", type=int, default=1408)
    parser.add_argument("--max-num-batched-tokens", type=int, default=512)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.dtype = engine_dtype(args.dtype)
    args.kv_bytes = args.kv_bytes or kv_bytes(40 << 20, args.dtype)
    meta = start_run(args.model, args.dtype, args.seeds)
    started = time.perf_counter()
    results = asyncio.run(main_async(args))
    levels, seeds = [str(q) for q in args.qps], [str(s) for s in args.seeds]
    report = {"quick": args.quick, "sessions": args.sessions, "delay": args.delay, "qps": list(args.qps),
              "kv_bytes": args.kv_bytes, "max_num_batched_tokens": args.max_num_batched_tokens,
              "replay_order": REPLAY_ORDER_INTERLEAVED,
              "shape": SHAPE, "wall_s": time.perf_counter() - started,
              "summary": summarize(results, levels, seeds), "runs": results}
    print({k: v for k, v in report["summary"].items() if k != "stream_vs_oneshot_ratios"})
    print(f"wrote {write_results(args.output, report, meta)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
