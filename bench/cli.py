"""`python -m bench.cli`: replay traces over HTTP against the Serve app; TTFT per policy and mode, plots.

    python -m bench.cli --workload crawler --requests 16 --qps 0.1,0.2 --policies fcfs,lcas
    python -m bench.cli --workload ~/.cache/stream2llm/traces/recorded_vector.csv --modes stream

Writes `results.json` (config, per-cell aggregates and cluster time series, per-request summaries),
`requests.csv` and PNG figures into `--out` (default: a new folder under the cache's `bench/`).
Synthetic traces are scaled to a CPU replica by default (`bench.http_replay.CPU_SHAPES`);
`--paper-shape` keeps the paper's token counts and `--shape key=value` overrides one parameter.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.http_replay import CPU_SHAPES, MODES, POLL_INTERVAL_S, SYNTHETIC, BenchError, BenchSpec, run_bench
from bench.plots import plot_all
from bench.results_meta import engine_dtype, start_run, with_meta
from bench.serving_metrics import add_slo_arguments, slos_from_args
from engine.config import DEFAULT_MODEL

CSV_DROP = ("answer", "sent_at", "token_times_s")  # long or process-local; kept in the JSON


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", default="crawler", help="crawler | vector | path of a trace CSV")
    parser.add_argument("--requests", type=int, default=16, help="requests per cell")
    parser.add_argument("--qps", default="0.2", help="arrival rate, or a comma list (one cell each)")
    parser.add_argument("--policies", default="fcfs", help="comma list of scheduling policies")
    parser.add_argument("--modes", default=",".join(MODES), help="comma list of stream, oneshot")
    parser.add_argument("--multiplier", type=float, default=1.0, help="retrieval delay multiplier")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default=DEFAULT_MODEL, help="smollm2 | tiny | a model folder")
    parser.add_argument("--max-tokens", type=int, default=16, help="answer tokens per request")
    parser.add_argument("--replicas", type=int, default=1, help="engine replicas (autoscaling minimum)")
    parser.add_argument("--max-replicas", type=int, help="autoscaling maximum (default: --replicas)")
    parser.add_argument("--kv-cache-bytes", type=int, help="KV cache per replica (default: the engine's)")
    parser.add_argument("--step-tokens", type=int, help="engine token budget per step (max_num_batched_tokens)")
    parser.add_argument("--shape", action="append", default=[], metavar="KEY=VALUE",
                        help="synthetic trace parameter (stream2llm.data.traces CRAWLER_SHAPE / VECTOR_SHAPE)")
    parser.add_argument("--paper-shape", action="store_true", help="paper-scale synthetic tokens")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), help="model dtype (default: the engine's)")
    parser.add_argument("--clients", type=int, default=0,
                        help="closed loop with this many concurrent clients (0: open loop at --qps)")
    add_slo_arguments(parser)
    parser.add_argument("--out", type=Path, help="output folder (default: cache bench/<workload>-<time>)")


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise BenchError(f"--qps must be numbers separated by commas, got {text!r}") from None


def _names(text: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in text.split(",") if v.strip())


def _shape(args) -> dict:
    shape = {} if args.paper_shape else dict(CPU_SHAPES.get(args.workload, {}))
    for item in args.shape:
        key, sep, value = item.partition("=")
        if not sep:
            raise BenchError(f"--shape needs KEY=VALUE, got {item!r}")
        try:
            shape[key] = int(value) if value.lstrip("-").isdigit() else float(value)
        except ValueError:
            raise BenchError(f"--shape {key}: not a number: {value!r}") from None
    return shape


def app_sections(args) -> dict:
    """AppConfig sections of a benchmark run (policy and traces are added per run)."""
    model_section: dict = {"model": args.model}
    if args.kv_cache_bytes:
        model_section["kv_cache_memory_bytes"] = args.kv_cache_bytes
    if args.step_tokens:
        model_section["max_num_batched_tokens"] = args.step_tokens
    if args.dtype:
        model_section["dtype"] = args.dtype
    replicas = args.replicas
    # replicas report as often as /v1/cluster is polled, so the time series is not a second stale
    return {"model": model_section,
            "replicas": {"min_replicas": replicas, "max_replicas": max(replicas, args.max_replicas or replicas),
                         "report_interval_s": POLL_INTERVAL_S}}


def spec_from_args(args) -> BenchSpec:
    if args.workload not in SYNTHETIC and (args.shape or args.paper_shape):
        raise BenchError("--shape and --paper-shape apply to synthetic workloads only")
    return BenchSpec(workload=args.workload, requests=args.requests, qps=_floats(args.qps),
                     policies=_names(args.policies), modes=_names(args.modes), multiplier=args.multiplier,
                     seed=args.seed, max_tokens=args.max_tokens, shape=_shape(args),
                     app=app_sections(args), clients=args.clients, slos_ms=slos_from_args(args))


def start_meta(spec: BenchSpec):
    """Run metadata (`bench.results_meta`) for a replay of `spec`: model and dtype as the app runs them."""
    from pipeline.config import AppConfig

    model = AppConfig.model_validate({"model": spec.app.get("model", {})}).model
    return start_run(model.model, engine_dtype(model.dtype), seeds=[spec.seed])


def run_with_traces(spec: BenchSpec, progress: bool = True) -> dict:
    """`run_bench` with a throw-away trace folder under the cache and a progress bar over requests."""
    from tqdm import tqdm

    from stream2llm.paths import cache_path

    total = spec.requests * len(spec.qps) * len(spec.modes) * len(spec.policies)
    parent = cache_path("traces")
    parent.mkdir(parents=True, exist_ok=True)
    trace_dir = Path(tempfile.mkdtemp(prefix="bench-", dir=parent))
    try:
        with tqdm(total=total, unit="req", desc="requests", disable=not progress) as bar:
            return run_bench(spec, trace_dir, on_done=bar.update)
    finally:
        shutil.rmtree(trace_dir, ignore_errors=True)


def write_requests_csv(requests: list[dict], path: Path) -> Path:
    rows = [{k: (";".join(map(str, v)) if isinstance(v, list) else v) for k, v in r.items() if k not in CSV_DROP}
            for r in requests]
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["trace"])
        writer.writeheader()
        writer.writerows(rows)
    return path


def save_outputs(result: dict, folder: Path) -> list[Path]:
    """results.json, requests.csv and the figures; the written paths."""
    folder.mkdir(parents=True, exist_ok=True)
    json_path = folder / "results.json"
    json_path.write_text(json.dumps(result, indent=1, default=str), encoding="utf-8")  # meta first: with_meta
    return [json_path, write_requests_csv(result["requests"], folder / "requests.csv"),
            *plot_all(result, folder)]


CELL_COLUMNS = ("policy", "mode", "qps", "clients", "sessions", "answered", "rejected", "failed", "ttft_p50_s",
                "ttft_p95_s", "ttft_p99_s", "engine_ttft_p50_s", "pipeline_overhead_p50_s", "makespan_s",
                "e2e_p50_s", "e2e_p99_s", "sessions_per_s")


def print_cells(cells: list[dict], out=sys.stdout) -> None:
    print("  ".join(f"{c:>10.10}" for c in CELL_COLUMNS), file=out)
    for cell in cells:
        values = (cell[c] for c in CELL_COLUMNS)
        print("  ".join(f"{v:>10.4g}" if isinstance(v, float) else f"{v!s:>10.10}" for v in values), file=out)


def run(args) -> int:
    try:
        spec = spec_from_args(args)
        spec.validate()
    except ValueError as e:  # BenchError, UnknownPolicyError, TraceFormatError
        print(f"bench.cli: {e}", file=sys.stderr)
        return 2
    from stream2llm.paths import cache_path

    name = Path(spec.workload).stem
    out = args.out or cache_path("bench", f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")
    meta = start_meta(spec)
    result = {"command": " ".join(sys.argv), **run_with_traces(spec)}
    result = with_meta(result, meta)
    print_cells(result["cells"])
    for path in save_outputs(result, out):
        print(f"wrote {path}")
    return 0 if all(c["failed"] == 0 for c in result["cells"]) else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    raise SystemExit(run(parser.parse_args()))
