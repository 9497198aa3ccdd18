"""`stream2llm calibrate`: measure this machine's engine and write the scheduler's cost model
(the measurements are `engine.calibration`)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from engine.calibration import DEFAULT_BATCHES, DEFAULT_SIZES, calibrate, default_output
from engine.config import DEFAULT_MODEL, PLATFORMS, EngineConfig
from engine.engine_args import detect_platform, resolve_platform
from scheduler.cost_model import load_cost_model, save_cost_model


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from exc


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=DEFAULT_MODEL, help="offline model name or model folder")
    parser.add_argument("--sizes", type=_ints, default=DEFAULT_SIZES, help="prompt sizes (tokens)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--decode-batches", type=_ints, default=DEFAULT_BATCHES,
                        help="decode batch sizes to time; empty to skip")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--kv-cache-bytes", type=int, default=256 << 20)
    parser.add_argument("--platform", default="auto", choices=PLATFORMS)
    parser.add_argument("--kv-offload-gib", type=float, default=None,
                        help="GPU only: enable vLLM's CPU KV offloading and measure the swap-in side")
    parser.add_argument("--output", type=Path, help="cost-model JSON (default: the cache folder)")


def run(args: argparse.Namespace) -> int:
    config = EngineConfig(model=args.model, max_model_len=args.max_model_len, platform=args.platform,
                          kv_cache_memory_bytes=args.kv_cache_bytes, kv_offload_gib=args.kv_offload_gib,
                          max_num_batched_tokens=args.max_num_batched_tokens, answer_budget_tokens=1)
    document = asyncio.run(calibrate(config, args.sizes, args.repeats, args.decode_batches))
    output = args.output or default_output(args.model, resolve_platform(config, detect_platform()))
    output.parent.mkdir(parents=True, exist_ok=True)
    save_cost_model(document, output)
    model = load_cost_model(output)
    for size in model.recompute.xs:
        print(f"recompute {int(size):6d} tokens: {model.recompute_s(int(size)) * 1e3:8.1f} ms")
    if model.decode_step is not None:
        for batch in model.decode_step.xs:
            print(f"decode step batch {int(batch):4d}: {model.decode_step(batch) * 1e3:8.1f} ms")
    if model.prefill_context is not None:
        for pairs in model.prefill_context.xs[1:]:
            print(f"cached-context prefill {int(pairs):9d} pairs: +{model.prefill_context(pairs) * 1e3:6.1f} ms")
    if model.decode_context is not None:
        for tokens in model.decode_context.xs[1:]:
            print(f"decode context +{int(tokens):6d} tokens: +{model.decode_context(tokens) * 1e3:6.1f} ms")
    print(f"swap: {'available' if model.swap_available else 'unavailable on this device'}")
    print(f"wrote {output}")
    return 0
