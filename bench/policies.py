"""Scheduling policies at paper scale in the simulator, with the parametric H200 model.

    python -m bench.policies [--quick]  ->  bench/results/policies.json

Scenarios (DESIGN.md section 6): crawler at 10x delay, QPS 4; vector search at 30x delay, QPS 2;
plus the crawler at 1x delay and QPS 1 (low pressure) for the median-TTFT comparison, and at QPS 3
(moderate pressure). Memory: the crawler runs
on the H200 preset's full KV (~815k tokens, 107 GB: ~300 concurrent streams of ~5k tokens need
about twice that). Vector contexts are smaller (~2.9k tokens), so ~270 streams fit in a full H200;
its pressure scenario gives the engine 20 GB of KV (~160k tokens, as when the GPU also hosts a
bigger model or other tenants), about half of what the streams would hold. Host swap pool: 32 GiB.
Reshaped workloads: `crawler_heavy_tail` (chunk gaps with the same median but three times the
mean: a heavier tail) and `crawler_many_small` (twice the chunks, each half the size); no parameter
was chosen on them, but two planner rules (the memory gate on early prefill, the swap pool
following the clocks) came from tracing the heavy-tailed one.
Every scenario runs with trace/arrival seeds 0-2 (`--seeds`); each seed's grid is kept in the JSON
(`seeds`), and `sim` holds seed 0's grid as before. `tailguard_vs_oneshot` says, per seed,
whether TailGuard's streaming P99 TTFT is at most the one-shot one, and its P50 speed-up.
Each JSON entry leaves room for an `engine` key (the same comparison on the real CPU engine).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench.results_meta import start_run, write_results
from scheduler.simulator.grid import GENERATORS, HEADER, run_grid
from scheduler.gpu_model import ParametricCostModel
from scheduler.policies import POLICIES
from scheduler.simulator import SimEngineConfig
from stream2llm.data.traces import PromptMode

RESULTS = Path(__file__).parent / "results" / "policies.json"
KV_BYTES_PER_BLOCK = 16 * 131072
SWAP_POOL_BLOCKS = int(32 * 2**30 // KV_BYTES_PER_BLOCK)
SCENARIOS = {
    "crawler": dict(n=4322, qps=4.0, delay=10.0, kv_gb=None),
    "vector": dict(n=2000, qps=2.0, delay=30.0, kv_gb=20.0),
    "crawler_low_pressure": dict(n=1000, qps=1.0, delay=1.0, kv_gb=None, workload="crawler"),
    # FCFS holds the tail here but collapses at QPS 4 in our model (see docs/BENCHMARKS_COMPONENTS.md).
    "crawler_qps3": dict(n=4322, qps=3.0, delay=10.0, kv_gb=None, workload="crawler"),
    "crawler_heavy_tail": dict(n=4322, qps=4.0, delay=10.0, kv_gb=None, workload="crawler",
                               shape=dict(gap_mean_s=3.15)),
    "crawler_many_small": dict(n=4322, qps=4.0, delay=10.0, kv_gb=None, workload="crawler",
                               shape=dict(mean_scrapes=13.8, page_tokens=600)),
}


def run_scenario(name: str, spec: dict, quick: bool, cost: ParametricCostModel, seeds) -> dict:
    n = max(200, spec["n"] // 8) if quick else spec["n"]
    blocks = (int(spec["kv_gb"] * 1e9 // KV_BYTES_PER_BLOCK) if spec["kv_gb"]
              else cost.kv_capacity_blocks())
    workload = spec.get("workload", name)
    started, grids = time.perf_counter(), {}
    for seed in seeds:
        traces = GENERATORS[workload](n, seed=seed, **spec.get("shape", {}))
        print(f"\n{name} seed {seed}: {n} requests, qps {spec['qps']}, delay x{spec['delay']}, {blocks} KV blocks")
        print(HEADER)
        grids[str(seed)] = run_grid(traces, cost, policies=list(POLICIES), modes=list(PromptMode), qps=spec["qps"],
                                    seed=seed, delay=spec["delay"],
                                    engine=SimEngineConfig(blocks, 16, 8192, SWAP_POOL_BLOCKS))
    return {"num_requests": n, "qps": spec["qps"], "delay": spec["delay"], "shape": spec.get("shape", {}),
            "kv_blocks": blocks, "kv_tokens": blocks * 16, "swap_pool_blocks": SWAP_POOL_BLOCKS,
            "sim_wall_s": time.perf_counter() - started, "sim": grids[str(seeds[0])], "seeds": grids,
            "tailguard_vs_oneshot": {seed: _versus(grid) for seed, grid in grids.items()}}


def _versus(grid: dict) -> dict:
    tail, base = grid[PromptMode.STREAM]["tailguard"], grid[PromptMode.ONESHOT]["default_vllm"]
    return {"p99_ratio": tail["ttft_p99_s"] / base["ttft_p99_s"],
            "p99_at_most_oneshot": tail["ttft_p99_s"] <= base["ttft_p99_s"],
            "p50_speedup": base["ttft_p50_s"] / tail["ttft_p50_s"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1/8 of the requests")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--seeds", default="0,1,2", help="trace and arrival seeds")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    cost = ParametricCostModel()
    seeds = [int(x) for x in args.seeds.split(",")]
    meta = start_run("simulator: parametric H200 cost model", "n/a (simulated)", seeds)
    report = {"hardware": cost.describe(), "quick": args.quick, "workloads": {}}
    if args.output.exists():
        previous = json.loads(args.output.read_text())
        report["workloads"] = previous.get("workloads", {})
    for name in args.scenarios.split(","):
        entry = run_scenario(name, SCENARIOS[name], args.quick, cost, seeds)
        kept = report["workloads"].get(name, {}).get("engine")
        report["workloads"][name] = {**entry, **({"engine": kept} if kept else {})}
    print(f"\nwrote {write_results(args.output, report, meta)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
