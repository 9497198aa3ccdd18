"""Runs of the simulator over a grid of policies and modes, shared by `stream2llm sim` and the
benchmarks."""

from __future__ import annotations

from stream2llm.data.traces import (read_crawler_csv, read_vector_csv, synthetic_crawler_traces,
                               synthetic_vector_traces)
from scheduler.simulator import SimConfig, SimEngineConfig, simulate

GENERATORS = {"crawler": synthetic_crawler_traces, "vector": synthetic_vector_traces}
READERS = {"crawler": read_crawler_csv, "vector": read_vector_csv}


def run_grid(traces, cost, *, policies, modes, qps, seed, delay, engine: SimEngineConfig,
             engines: int = 1, router: str = "least_active", arrivals: str = "poisson", echo=print) -> dict:
    """results[mode][policy] = summary dict."""
    results: dict = {}
    for mode in modes:
        for policy in policies:
            config = SimConfig(policy, mode, engine, engines, qps, seed, delay, router=router, arrivals=arrivals)
            summary = simulate(traces, config, cost).summary()
            results.setdefault(mode, {})[policy] = summary
            echo(format_row(mode, policy, summary))
    return results


def format_row(mode: str, policy: str, s: dict) -> str:
    return (f"{mode:14s} {policy:13s} {s['ttft_p50_s']:8.3f} {s['ttft_p95_s']:8.3f} "
            f"{s['ttft_p99_s']:8.3f} {s['makespan_s']:9.1f} {s['preemptions']:7d} "
            f"{s['tokens_invalidated']:11d} {s['tokens_recomputed']:11d} {s['wall_s']:6.1f}")


HEADER = (f"{'mode':14s} {'policy':13s} {'p50_s':>8s} {'p95_s':>8s} {'p99_s':>8s} "
          f"{'makespan':>9s} {'preempt':>7s} {'invalidated':>11s} {'recomputed':>11s} {'wall':>6s}")
