"""`stream2llm calibrate`: measure this machine's engine and write the scheduler's cost model.

Recompute (what a preempted request pays to come back) is measured as the time to the first token
of a prompt of N tokens with a fresh cache salt, so the prefix cache reuses nothing: exactly a full
prefill of N tokens plus one sampled token. Decode is measured as the median gap between tokens of
B requests decoding together. Swap is not measured where it does not exist: vLLM's KV offload is
CUDA-only, so on CPU the model records swap as unavailable (null) instead of inventing numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import time
import uuid
from pathlib import Path

import numpy as np

from engine.api import SamplingConfig
from engine.config import EngineConfig
from scheduler.cost_model import build_cost_model, load_cost_model, save_cost_model
from stream2llm.paths import cache_path

DEFAULT_SIZES = (32, 128, 256, 512, 1024, 2048)
DEFAULT_BATCHES = (1, 4, 16)
DECODE_TOKENS = 12
_FIRST_ID = 100  # skip the low ids where tokenizers keep their special tokens


class CalibrationError(ValueError):
    """Bad calibration parameters."""


def default_output(model: str) -> Path:
    return cache_path("cost_model", f"{Path(model).name}-cpu.json")


def random_prompt(rng: np.random.Generator, vocab_size: int, num_tokens: int) -> list[int]:
    return [int(t) for t in rng.integers(_FIRST_ID, vocab_size, size=num_tokens)]


async def time_to_first_token(engine, prompt: list[int], max_tokens: int = 1) -> float:
    """Seconds from submission to the first sampled token, nothing reused from the cache."""
    started = time.perf_counter()
    first = None
    async for delta in engine.generate(token_ids=prompt, sampling=SamplingConfig(max_tokens=max_tokens),
                                       cache_salt=uuid.uuid4().hex):
        if delta.token_ids and first is None:
            first = time.perf_counter() - started
    if first is None:
        raise RuntimeError("the engine returned no token")
    return first


async def measure_recompute(engine, sizes, repeats: int, rng, vocab_size: int) -> list[tuple[int, float]]:
    await time_to_first_token(engine, random_prompt(rng, vocab_size, sizes[0]))  # warm-up
    times: dict[int, list[float]] = {size: [] for size in sizes}
    for _ in range(repeats):  # sizes interleaved, so a burst of load elsewhere hits all of them
        for size in sizes:
            times[size].append(await time_to_first_token(engine, random_prompt(rng, vocab_size, size)))
    return [(size, statistics.median(values)) for size, values in times.items()]  # spikes: outliers


async def _token_times(engine, prompt: list[int]) -> list[float]:
    times = []
    async for delta in engine.generate(token_ids=prompt, sampling=SamplingConfig(max_tokens=DECODE_TOKENS),
                                       cache_salt=uuid.uuid4().hex):
        times.extend(time.perf_counter() for _ in delta.token_ids)
    return times


async def measure_decode(engine, batches, rng, vocab_size: int) -> list[tuple[int, float]]:
    """Median inter-token gap while `batch` requests decode together (short prompts)."""
    pairs = []
    for batch in batches:
        runs = await asyncio.gather(*(_token_times(engine, random_prompt(rng, vocab_size, 16))
                                      for _ in range(batch)))
        gaps = [b - a for times in runs for a, b in zip(times, times[1:])]
        if gaps:
            pairs.append((batch, statistics.median(gaps)))
    return pairs


async def measure_cost_model(engine, config: EngineConfig, sizes, repeats: int, batches,
                             seed: int = 0) -> dict:
    """Measure a running engine built from `config`; the cost-model JSON document."""
    if not sizes or min(sizes) <= 0 or repeats <= 0:
        raise CalibrationError(f"need positive sizes and repeats, got sizes={sizes}, repeats={repeats}")
    if max(sizes) + 1 > config.max_model_len:
        raise CalibrationError(f"size {max(sizes)} does not fit max_model_len {config.max_model_len}")
    rng = np.random.default_rng(seed)
    vocab = len(engine.tokenizer)
    recompute = await measure_recompute(engine, sorted(sizes), repeats, rng, vocab)
    decode = await measure_decode(engine, batches, rng, vocab) if batches else []
    block_size = (await engine.stats()).block_size  # the engine's, after platform defaults
    return build_cost_model(
        recompute, decode_step=decode, block_size=block_size, model=config.model,
        device=f"cpu ({platform.machine()}, {platform.node()})",
        notes=(f"stream2llm calibrate: recompute = time to first token of N fresh tokens "
               f"(median of {repeats} runs), max_num_batched_tokens={config.max_num_batched_tokens}; "
               f"decode = median inter-token gap at batch B; swap unavailable: vLLM KV offload "
               f"is CUDA-only"),
    )


async def calibrate(config: EngineConfig, sizes, repeats: int, batches, seed: int = 0) -> dict:
    """Start an engine for `config`, measure it, shut it down; the cost-model JSON document."""
    from engine.vllm_engine import create_engine

    if not sizes or max(sizes) + 1 > config.max_model_len:
        raise CalibrationError(f"sizes {sizes} must be non-empty and fit max_model_len {config.max_model_len}")
    engine = await create_engine(config)
    try:
        return await measure_cost_model(engine, config, sizes, repeats, batches, seed)
    finally:
        await engine.shutdown()


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from exc


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2", help="offline model name or model folder")
    parser.add_argument("--sizes", type=_ints, default=DEFAULT_SIZES, help="prompt sizes (tokens)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--decode-batches", type=_ints, default=DEFAULT_BATCHES,
                        help="decode batch sizes to time; empty to skip")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--kv-cache-bytes", type=int, default=256 << 20)
    parser.add_argument("--output", type=Path, help="cost-model JSON (default: the cache folder)")


def run(args: argparse.Namespace) -> int:
    config = EngineConfig(model=args.model, max_model_len=args.max_model_len,
                          kv_cache_memory_bytes=args.kv_cache_bytes,
                          max_num_batched_tokens=args.max_num_batched_tokens, answer_budget_tokens=1)
    document = asyncio.run(calibrate(config, args.sizes, args.repeats, args.decode_batches))
    output = args.output or default_output(args.model)
    output.parent.mkdir(parents=True, exist_ok=True)
    save_cost_model(document, output)
    model = load_cost_model(output)
    for size in model.recompute.xs:
        print(f"recompute {int(size):6d} tokens: {model.recompute_s(int(size)) * 1e3:8.1f} ms")
    if model.decode_step is not None:
        for batch in model.decode_step.xs:
            print(f"decode step batch {int(batch):4d}: {model.decode_step(batch) * 1e3:8.1f} ms")
    print(f"swap: {'available' if model.swap_available else 'unavailable on this device'}")
    print(f"wrote {output}")
    return 0
