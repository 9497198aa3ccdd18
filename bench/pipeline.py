"""Pipeline over HTTP, end to end: streaming vs one-shot through the Ray Serve app.

    python -m bench.pipeline [--quick]            ->  bench/results/pipeline.json (closed loop)
    python -m bench.pipeline --clients 0 --qps 0.05   (open loop: seeded Poisson arrivals)

SmolLM2 on one CPU replica, crawler-shaped synthetic traces scaled to a CPU (about 6.5 chunks of
300-500 tokens, ~0.7 s apart; `bench.http_replay.CPU_SHAPES`), 12 sessions per mode, one policy.
By default a closed loop of `--clients` concurrent clients, each sending its next session when the
previous one ended: the replica is never idle waiting for arrivals, so service time decides the
rate and `throughput_ratio` (streaming / one-shot answered sessions per second of makespan, target
>= 0.95) can fail. Takes the same options as `python -m bench.cli`, with these defaults.
TTFT is the client's: from the `retrieval_done` event to the first answer token over HTTP;
`e2e_p50_s`/`e2e_p99_s` are whole sessions (send to last event), per mode; `serving` holds the
`vllm bench serve` metrics (TTFT from `retrieval_done`; `--slo-ttft` for goodput).
`pipeline_overhead_p50_s` is the median over all answered requests of that client TTFT minus the
engine's own TTFT for the same request (ingress, Serve handle routing and SSE on the way back).
Per mode, `ingress` holds what the (one) ingress replica did per session: CPU seconds, chunk text
bytes it handled, and Ray hops per context piece (`bench.ingress_costs`; streamed: 1, the replicas
pull the retriever's stream themselves; one-shot: 2, the baseline buffers text in the ingress).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.cli import add_arguments, print_cells, run_with_traces, spec_from_args, start_meta
from bench.http_replay import BenchError, aggregate
from bench.plots import plot_all
from bench.results_meta import write_results
from stream2llm.data.traces import PromptMode

RESULTS = Path(__file__).parent / "results"
# 512-token engine steps: a finished session's question and decode wait behind one short step of
# other sessions' chunk prefill, not a 2048-token one (~1.5 s on one CPU thread).
DEFAULTS = dict(requests=12, qps="0.05", policies="fcfs", modes="stream,oneshot", model="smollm2",
                max_tokens=16, step_tokens=512, clients=4)
PARITY_TARGET = 0.95
QUICK_REQUESTS = 5
REQUEST_KEYS = ("mode", "trace", "status", "ok", "error", "answer", "ttft_s", "engine_ttft_s", "latency_s",
                "retrieval_s", "context_tokens", "tokens_prefilled_before_finish", "arrival_s", "sent_s",
                "first_token_s", "retrieval_done_s", "output_tokens")


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _cell_view(cell: dict) -> dict:
    return {k: v for k, v in cell.items() if k != "series"}


def summarize(result: dict) -> dict:
    """The headline figures of a stream-vs-oneshot result at one QPS and policy."""
    cells = {c["mode"]: c for c in result["cells"]}
    if set(cells) != set(PromptMode) or len(result["cells"]) != 2:
        raise BenchError("the pipeline comparison needs exactly one stream and one oneshot cell")
    stream, oneshot = cells[PromptMode.STREAM], cells[PromptMode.ONESHOT]
    ratio = _ratio(stream["sessions_per_s"], oneshot["sessions_per_s"])
    return {
        "load": f"closed loop, {stream['clients']} clients" if stream["clients"] else "open loop (Poisson)",
        PromptMode.STREAM: _cell_view(stream), PromptMode.ONESHOT: _cell_view(oneshot),
        "speedup_p50": _ratio(oneshot["ttft_p50_s"], stream["ttft_p50_s"]),
        "speedup_p95": _ratio(oneshot["ttft_p95_s"], stream["ttft_p95_s"]),
        "throughput_ratio": ratio, "throughput_target": PARITY_TARGET,
        "throughput_parity_met": ratio is not None and ratio >= PARITY_TARGET,
        "e2e_s": {m: {"p50": c["e2e_p50_s"], "p99": c["e2e_p99_s"]} for m, c in ((PromptMode.STREAM, stream),
                                                                                  (PromptMode.ONESHOT, oneshot))},
        "makespan_ratio": _ratio(stream["makespan_s"], oneshot["makespan_s"]),
        "sessions": stream["sessions"],  # per mode
        "failed": stream["failed"] + oneshot["failed"],
        "rejected": stream["rejected"] + oneshot["rejected"],
        "pipeline_overhead_p50_s": aggregate(result["requests"])["pipeline_overhead_p50_s"],
        "ray_hops_per_chunk": stream["ingress"]["ray_hops_per_chunk"],  # bench.ingress_costs; target 1
        "wall_s": result["wall_s"], "command": result["command"], "config": result["config"],
        "requests": [{k: r.get(k) for k in REQUEST_KEYS} for r in result["requests"]],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_REQUESTS} requests per mode")
    parser.add_argument("--output", type=Path, default=RESULTS / "pipeline.json")
    parser.set_defaults(**DEFAULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.requests = QUICK_REQUESTS
    try:
        spec = spec_from_args(args)
        spec.validate()
    except ValueError as e:
        print(f"bench.pipeline: {e}", file=sys.stderr)
        return 2
    meta = start_meta(spec)
    result = {"command": " ".join(["python -m bench.pipeline", *(sys.argv[1:] if argv is None else argv)]),
              **run_with_traces(spec)}
    print_cells(result["cells"])
    summary = summarize(result)
    write_results(args.output, summary, meta)
    figures = plot_all(result, args.out or args.output.parent, prefix="pipeline_")
    for key in ("load", "throughput_ratio", "throughput_parity_met", "e2e_s", "speedup_p50", "pipeline_overhead_p50_s",
                "ray_hops_per_chunk", "failed", "wall_s"):
        print(f"{key}: {summary[key]}")
    print(f"wrote {args.output}, " + ", ".join(str(p) for p in figures))
    return 0 if summary["failed"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
