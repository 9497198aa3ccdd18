"""Our app against plain `vllm serve`: same model and engine settings, both driven by `vllm bench serve`.

    python -m bench.vs_vllm_serve                       # SmolLM2, rates 0.5 and 1 req/s, 24 prompts each
    python -m bench.vs_vllm_serve --num-prompts 8 --rates 1 2 --out /tmp/quick.json
    python -m bench.vs_vllm_serve --env RAY_SERVE_CONTROL_LOOP_INTERVAL_S=1 --out /tmp/try.json  # a Ray setting tried
    python -m bench.vs_vllm_serve --reserved-cores 1 --out bench/results/vs_vllm_serve_reserved1.json

Our one engine replica reserves the machine's CPUs, as `vllm serve` takes them all: it then runs vLLM's
"mp" executor and thread set-up as `vllm serve` does (`pipeline.placement.cpu_engine_env`, which gives
both servers their environment). `--reserved-cores N` keeps N cores off the model's pinned threads in
both servers, for the processes beside the model: the hop measured where it does not share the
model's cores.
Order A-B-A in one run (vLLM, ours, vLLM again) so drift shows; in each phase both routes
(`/v1/chat/completions` with `--backend openai-chat`, `/v1/completions` with `--backend openai`) at
every rate, random dataset (fixed seed), `--ignore-eos` so both servers generate the same tokens.
Ratios are ours / the mean of the two vLLM phases, per cell and worst over cells:
`ttft_p50_ratio`, `ttft_p99_ratio`, `tpot_p50_ratio`, `throughput_ratio` (output tokens/s).
Targets: TTFT P50 ratio <= 1.10, throughput ratio >= 0.95. `vllm_drift` is vLLM's second phase over
its first (TTFT P50): how much the machine moved during the run. Each `vllm bench serve` result file
is kept (its scalar fields and errors). `cpu_by_process` is each phase's CPU seconds per process
role over its measured runs (`bench.process_cpu`): on a machine the servers share with nothing,
where the CPU went besides the model.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import httpx

from bench.process_cpu import cpu_by_role, snapshot
from bench.results_meta import ROOT, engine_dtype, start_run, write_results

ROUTES = {"chat": ("openai-chat", "/v1/chat/completions"), "completions": ("openai", "/v1/completions")}
MODEL_NAME = "stream2llm"
TARGETS = {"ttft_p50_ratio": ("<=", 1.10), "throughput_ratio": (">=", 0.95)}
METRICS = {"ttft_p50_ratio": "median_ttft_ms", "ttft_p99_ratio": "p99_ttft_ms", "tpot_p50_ratio": "median_tpot_ms",
           "throughput_ratio": "output_throughput"}


def app_config(args) -> dict:
    """Our app as an OpenAI-only deployment runs it: no retriever pools started ahead of a RAG request
    (`retrievers.warm_pools`; session shards start with their first session anyway)."""
    return {"model": {"model": args.model, "max_model_len": args.max_model_len, "kv_cache_memory_bytes": args.kv_bytes},
            "replicas": {"min_replicas": 1, "max_replicas": 1, "num_cpus": float(os.cpu_count() or 1),
                         "cpu_reserved_cores": args.reserved_cores},
            "retrievers": {"warm_pools": False}}


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """The model and engine settings both servers are given (`app_config`)."""
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--kv-bytes", type=int, default=256 << 20)
    parser.add_argument("--reserved-cores", type=int, default=0,
                        help="cores both servers keep off the model's pinned threads (replicas.cpu_reserved_cores, "
                             "VLLM_CPU_NUM_OF_RESERVED_CPU): a machine with cores to spare for the serving layer")


def add_env_argument(parser: argparse.ArgumentParser, more: str = "") -> None:
    """`--env KEY=VALUE ...`: environment for our app's Ray, set before it starts."""
    parser.add_argument("--env", nargs="*", default=[], metavar="KEY=VALUE",
                        help="environment set before our app's Ray starts (Ray Serve settings to compare)" + more)


def parse_env(pairs: list[str]) -> dict:
    bad = [kv for kv in pairs if "=" not in kv]
    if bad:
        raise SystemExit(f"--env takes KEY=VALUE, got {bad}")
    return dict(kv.split("=", 1) for kv in pairs)


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def _free_port() -> int:
    from pipeline.run.local import free_port

    return free_port()


@contextlib.contextmanager
def plain_vllm_serve(config):
    """`vllm serve` (our CLI entry point: the CPU build) with the engine settings our replicas use."""
    from engine.engine_args import engine_kwargs
    from engine.vllm_cli import serve_cli_args
    from pipeline.placement import cpu_engine_env

    port = _free_port()
    cmd = [sys.executable, "-m", "engine.vllm_cli", "serve", *serve_cli_args(engine_kwargs(config.engine_config())),
           "--host", "127.0.0.1", "--port", str(port)]
    log = tempfile.NamedTemporaryFile("w+", prefix="vllm_serve_", suffix=".log", delete=False)
    env = {**_env(), **cpu_engine_env(config.replicas.num_cpus, config.replicas.cpu_reserved_cores)}
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 400
        while not _healthy(base):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"vllm serve did not start (log: {log.name})")
            time.sleep(1)
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _healthy(base: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(f"{base}/v1/models", timeout=5).status_code == 200
    return False


@contextlib.contextmanager
def our_app(config, env: dict | None = None):
    """Our app on a local Ray started here; `env` is set before Ray starts (Ray Serve settings to
    compare) and taken back after."""
    from pipeline.run.local import local_app

    with mock.patch.dict(os.environ, env or {}), \
            local_app(config, num_cpus=int(config.replicas.num_cpus), ready_timeout_s=400) as base:
        yield base


def bench_serve(base: str, route: str, rate: float, tokenizer: str, args, out_dir: Path) -> dict:
    """One `vllm bench serve` run; its result file's scalar fields (and errors, if any)."""
    backend, endpoint = ROUTES[route]
    name = f"r{time.monotonic_ns()}.json"
    cmd = [sys.executable, "-m", "engine.vllm_cli", "bench", "serve", "--backend", backend, "--base-url", base,
           "--endpoint", endpoint, "--model", MODEL_NAME, "--tokenizer", tokenizer, "--dataset-name", "random",
           "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len), "--ignore-eos",
           "--num-prompts", str(args.num_prompts), "--request-rate", str(rate), "--seed", str(args.seed),
           "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99", "--disable-tqdm",
           "--save-result", "--result-dir", str(out_dir), "--result-filename", name]
    run = subprocess.run(cmd, env=_env(), cwd=ROOT, capture_output=True, text=True, timeout=1800)
    if run.returncode != 0:
        raise RuntimeError(f"vllm bench serve failed: {run.stdout[-2000:]}{run.stderr[-2000:]}")
    raw = json.loads((out_dir / name).read_text())
    kept = {k: v for k, v in raw.items() if isinstance(v, (int, float, str, bool)) or v is None}
    kept["errors"] = [e for e in raw.get("errors", []) if e]
    return kept


def ratios(ours: dict, first: dict, second: dict) -> dict:
    out = {key: ours[metric] / ((first[metric] + second[metric]) / 2) for key, metric in METRICS.items()}
    out["vllm_drift"] = second["median_ttft_ms"] / first["median_ttft_ms"]
    return out


def summarize(cells: list[dict]) -> dict:
    worst = {key: (max if key != "throughput_ratio" else min)(c["ratios"][key] for c in cells) for key in METRICS}
    met = {key: (worst[key] <= bound if op == "<=" else worst[key] >= bound) for key, (op, bound) in TARGETS.items()}
    failed = sum(r["failed"] for c in cells for r in (c["vllm_first"], c["ours"], c["vllm_second"]))
    return {"worst": worst, "targets": {k: f"{op} {b}" for k, (op, b) in TARGETS.items()}, "met": met,
            "failed_requests": failed}


def run(args) -> dict:
    from engine.models import resolve_model
    from pipeline.config import AppConfig

    config = AppConfig.model_validate(app_config(args))
    tokenizer = resolve_model(args.model)
    cells = [(route, rate) for route in args.routes for rate in args.rates]
    phases, cpu = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        ours = functools.partial(our_app, env=parse_env(args.env))
        for name, server in (("vllm_first", plain_vllm_serve), ("ours", ours), ("vllm_second", plain_vllm_serve)):
            with server(config) as base:
                bench_serve(base, args.routes[0], args.rates[-1], tokenizer, _warmup(args), Path(tmp))
                before, started = snapshot(), time.monotonic()
                phases.append({cell: bench_serve(base, *cell, tokenizer, args, Path(tmp)) for cell in cells})
                cpu[name] = {"wall_s": round(time.monotonic() - started, 1), "cpu_s": cpu_by_role(before, snapshot())}
                print(f"[vs_vllm_serve] {name}: " + ", ".join(
                    f"{r}@{q}: TTFT p50 {v['median_ttft_ms']:.0f} ms" for (r, q), v in phases[-1].items()), flush=True)
    out = []
    for cell in cells:
        first, ours, second = (p[cell] for p in phases)
        out.append({"route": cell[0], "request_rate": cell[1], "ratios": ratios(ours, first, second),
                    "vllm_first": first, "ours": ours, "vllm_second": second})
    return {"settings": {**vars(args), "engine": app_config(args)["model"]}, "cells": out, "summary": summarize(out),
            "cpu_by_process": cpu}


def _warmup(args):
    """A few requests per server before the measured runs (first-request costs are not the hop's)."""
    return argparse.Namespace(**{**vars(args), "num_prompts": 2})


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_server_arguments(p)
    p.add_argument("--rates", type=float, nargs="+", default=[0.5, 1.0])
    p.add_argument("--routes", nargs="+", default=list(ROUTES), choices=list(ROUTES))
    p.add_argument("--num-prompts", type=int, default=24)
    p.add_argument("--input-len", type=int, default=200)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    add_env_argument(p, "; vllm serve runs without it")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "vs_vllm_serve.json"))
    args = p.parse_args(argv)
    meta = start_run(model=args.model, dtype=engine_dtype(None), seeds=[args.seed])
    report = run(args)
    path = write_results(Path(args.out), report, meta)
    s = report["summary"]
    print(f"[vs_vllm_serve] worst ratios {json.dumps({k: round(v, 3) for k, v in s['worst'].items()})}; "
          f"met {s['met']}; failed requests {s['failed_requests']}; -> {path}")


if __name__ == "__main__":
    main()
