"""`stream2llm sim`: replay synthetic (or recorded) traces through the simulator, per policy and
mode; print a table and write JSON."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from scheduler.cost_model import load_cost_model
from scheduler.gpu_model import PRESETS
from scheduler.policies import POLICIES
from scheduler.simulator import SimEngineConfig
from scheduler.simulator.arrivals import ARRIVALS
from scheduler.simulator.grid import GENERATORS, HEADER, READERS, run_grid
from scheduler.simulator.routers import ROUTERS
from stream2llm.data.traces import PromptMode


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", choices=sorted(GENERATORS), default="crawler")
    parser.add_argument("--traces", type=Path, help="trace CSV of the workload's shape (default: synthetic)")
    parser.add_argument("-n", "--num-requests", type=int, default=500)
    parser.add_argument("--qps", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--delay", type=float, default=1.0, help="delay multiplier (memory pressure)")
    parser.add_argument("--tokens-scale", type=float, default=1.0)
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--modes", default=",".join(PromptMode))
    parser.add_argument("--hardware", choices=sorted(PRESETS), default="h200")
    parser.add_argument("--cost-model", type=Path, help="measured cost-model JSON (overrides --hardware)")
    parser.add_argument("--kv-blocks", type=int, help="KV blocks per engine (default: from the hardware)")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--max-num-tokens", type=int, default=8192)
    parser.add_argument("--swap-pool-blocks", type=int, default=16384, help="host swap pool per engine")
    parser.add_argument("--engines", type=int, default=1)
    parser.add_argument("--router", choices=sorted(ROUTERS), default="least_active",
                        help="how sessions pick an engine (scheduler.simulator.routers)")
    parser.add_argument("--arrivals", choices=sorted(ARRIVALS), default="poisson")
    parser.add_argument("--output", type=Path, help="write results as JSON here")


def load_traces(args) -> list:
    if args.traces:
        return READERS[args.workload](args.traces)[: args.num_requests]
    return GENERATORS[args.workload](args.num_requests, args.seed, tokens_scale=args.tokens_scale)


def make_cost(args):
    return load_cost_model(args.cost_model) if args.cost_model else PRESETS[args.hardware]()


def run(args) -> int:
    cost = make_cost(args)
    kv_blocks = args.kv_blocks or (cost.kv_capacity_blocks() if hasattr(cost, "kv_capacity_blocks") else 0)
    if kv_blocks <= 0:
        print("error: --kv-blocks is required with a measured cost model", file=sys.stderr)
        return 2
    engine = SimEngineConfig(kv_blocks, args.block_size, args.max_num_tokens, args.swap_pool_blocks)
    traces = load_traces(args)
    print(f"{args.workload}: {len(traces)} requests, qps {args.qps}, delay x{args.delay}, "
          f"{kv_blocks} KV blocks x {args.engines} engine(s), swap {'yes' if cost.swap_available else 'no'}")
    print(HEADER)
    results = run_grid(traces, cost, policies=args.policies.split(","), modes=args.modes.split(","),
                       qps=args.qps, seed=args.seed, delay=args.delay, engine=engine,
                       engines=args.engines, router=args.router, arrivals=args.arrivals)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        payload = {"workload": args.workload, "num_requests": len(traces), "qps": args.qps,
                   "delay": args.delay, "kv_blocks": kv_blocks, "engines": args.engines,
                   "router": args.router, "arrivals": args.arrivals,
                   "results": results}
        args.output.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return 0
