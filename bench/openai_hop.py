"""Where one OpenAI request's time goes before vLLM sees it: single requests, the median of many.

    python -m bench.openai_hop                  # our app (SmolLM2, vs_vllm_serve's settings)
    python -m bench.openai_hop --vllm --n 30    # also plain `vllm serve`, same model and settings
    python -m bench.openai_hop --env RAY_SERVE_ENABLE_HA_PROXY=1   # a Ray Serve setting tried

Each probe sends one request at a time (after a warm-up), 200-token random prompts, max_tokens 1,
streamed; TTFT = the request sent -> its first token's chunk. Probes:
- `http_ttft`: /v1/completions through Serve's proxy and our ingress (the whole path);
- `replica_ttft`: this driver -> the engine deployment's `openai` method through a Serve handle
  (no proxy, no ingress, no admission);
- `engine_ttft`: vLLM's own first-token latency of those requests (arrival in the engine -> token);
- `admit_rtt`: this driver -> the central actor's `admit_request` (the call each OpenAI request's
  admission made) and back;
- `models_rtt`: GET /v1/models (proxy and ingress with nothing behind them);
- `vllm_http_ttft`: the same requests against plain `vllm serve` (with --vllm).
The breakdown subtracts medians: ingress path = http - replica; replica hop = replica - engine.
Writes bench/results/openai_hop.json (a probe's figures: not one of the docs' tables).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
from pathlib import Path

import httpx

from bench.results_meta import ROOT, engine_dtype, start_run, write_results
from bench.stats import percentile
from bench.vs_vllm_serve import (MODEL_NAME, add_env_argument, add_server_arguments, app_config, parse_env,
                                 plain_vllm_serve)


def _prompt(rng: random.Random, tokens: int) -> list[int]:
    return [rng.randrange(1000, 40000) for _ in range(tokens)]  # ids: the same length on both servers


def _body(prompt: list[int]) -> dict:
    return {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 1, "stream": True, "temperature": 0}


async def http_ttft(client: httpx.AsyncClient, base: str, body: dict) -> float:
    start, first = time.perf_counter(), None
    async with client.stream("POST", f"{base}/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():  # to the end, so the next request starts on an idle server
            if first is None and line.startswith("data: {") and json.loads(line[6:])["choices"]:
                first = time.perf_counter() - start
    if first is None:
        raise RuntimeError("no token chunk")
    return first


async def replica_ttft(handle, body: dict) -> tuple[float, float | None]:
    """(driver -> first token line, vLLM's own TTFT) through the engine deployment's handle."""
    from engine.api import OpenAITimings

    start, first, engine = time.perf_counter(), None, None
    async for item in handle.options(stream=True).openai.remote("completion", body):
        if first is None and isinstance(item, str) and '"choices":[{' in item:
            first = time.perf_counter() - start
        if isinstance(item, OpenAITimings):
            engine = item.ttft_s
    return first, engine


async def admit_rtt(scheduler, i: int) -> float:
    request_id = f"hop-probe-{i}"
    start = time.perf_counter()
    decision = await scheduler.admit_request.remote(request_id, 201, 5.0)
    took = time.perf_counter() - start
    await scheduler.release.remote(request_id)
    if "replica_id" not in decision:
        raise RuntimeError(f"probe admission refused: {decision}")
    return took


def _ms(values: list[float]) -> dict:
    return {"p50_ms": percentile([v * 1000 for v in values], 50), "p90_ms": percentile([v * 1000 for v in values], 90),
            "n": len(values)}


def probe_ours(config, args) -> dict:
    from ray import serve

    from pipeline.app import ENGINE_DEPLOYMENT
    from pipeline.control.central import get_or_create_scheduler
    from pipeline.run.local import local_app

    with local_app(config, num_cpus=2, ready_timeout_s=400) as base:
        handle = serve.get_deployment_handle(ENGINE_DEPLOYMENT, app_name=config.name)
        return asyncio.run(_probe_ours(base, handle, get_or_create_scheduler(config), args))


async def _probe_ours(base: str, handle, scheduler, args) -> dict:
    rng = random.Random(args.seed)
    out = {k: [] for k in ("http_ttft", "replica_ttft", "engine_ttft", "admit_rtt", "models_rtt")}
    async with httpx.AsyncClient(timeout=60) as client:
        for i in range(args.warmup + args.n):
            h = await http_ttft(client, base, _body(_prompt(rng, args.input_len)))
            r, e = await replica_ttft(handle, _body(_prompt(rng, args.input_len)))
            a = await admit_rtt(scheduler, i)
            start = time.perf_counter()
            (await client.get(f"{base}/v1/models")).raise_for_status()
            m = time.perf_counter() - start
            if i >= args.warmup:
                for key, value in zip(out, (h, r, e, a, m)):
                    out[key].append(value)
    return {key: _ms(values) for key, values in out.items()}


def probe_vllm(config, args) -> dict:
    with plain_vllm_serve(config) as base:
        return asyncio.run(_probe_vllm(base, args))


async def _probe_vllm(base: str, args) -> dict:
    rng = random.Random(args.seed)
    values = []
    async with httpx.AsyncClient(timeout=60) as client:
        for i in range(args.warmup + args.n):
            ttft = await http_ttft(client, base, _body(_prompt(rng, args.input_len)))
            if i >= args.warmup:
                values.append(ttft)
    return {"vllm_http_ttft": _ms(values)}


def breakdown(p: dict) -> dict:
    med = {k: v["p50_ms"] for k, v in p.items()}
    out = {"ingress_path_ms": med["http_ttft"] - med["replica_ttft"],
           "replica_hop_ms": med["replica_ttft"] - med["engine_ttft"]}
    if "vllm_http_ttft" in med:
        out["over_vllm_serve_ms"] = med["http_ttft"] - med["vllm_http_ttft"]
        out["ttft_p50_ratio"] = med["http_ttft"] / med["vllm_http_ttft"]
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_server_arguments(p)
    p.add_argument("--input-len", type=int, default=200)
    p.add_argument("--n", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vllm", action="store_true", help="also plain `vllm serve` (after ours)")
    add_env_argument(p)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "openai_hop.json"))
    args = p.parse_args(argv)
    os.environ.update(parse_env(args.env))
    from pipeline.config import AppConfig

    config = AppConfig.model_validate(app_config(args))
    meta = start_run(model=args.model, dtype=engine_dtype(None), seeds=[args.seed])
    probes = probe_ours(config, args)
    if args.vllm:
        probes.update(probe_vllm(config, args))
    report = {"settings": vars(args), "probes": probes, "breakdown": breakdown(probes)}
    path = write_results(Path(args.out), report, meta)
    print(json.dumps({"probes": {k: round(v["p50_ms"], 1) for k, v in probes.items()},
                      "breakdown": {k: round(v, 2) for k, v in report["breakdown"].items()}}), f"-> {path}")


if __name__ == "__main__":
    main()
