"""Measure this machine's engine for the scheduler's cost model (`stream2llm calibrate` is the command).

Recompute (what a preempted request pays to come back) is measured as the time to the first token
of a prompt of N tokens with a fresh cache salt, so the prefix cache reuses nothing: exactly a full
prefill of N tokens plus one sampled token. Decode is measured as the median gap between tokens of
B requests decoding together. What a streamed turn pays to attend to context cached by earlier
turns is measured as the TTFT of N new tokens after a cached prefix minus that of N fresh tokens,
and what a decode pays for a long context as its inter-token gap minus the gap at the decode
curve's short context (`measure_prefill_context`, `measure_decode_context`). Swap is measured only
where it exists (`--kv-offload-gib` on a GPU, `measure_swap_in`): vLLM's KV offload is CUDA-only,
so on CPU the model records swap as unavailable (null) instead of inventing numbers.
"""

from __future__ import annotations

import asyncio
import platform
import statistics
import time
import uuid
from pathlib import Path

import numpy as np

from engine.api import SamplingConfig
from engine.config import EngineConfig
from scheduler.cost_model import build_cost_model
from stream2llm.paths import cache_path

DEFAULT_SIZES = (32, 128, 256, 512, 1024, 2048)
DEFAULT_BATCHES = (1, 4, 16)
DECODE_TOKENS = 12
DECODE_PROMPT_TOKENS = 16  # the decode curve's context: short, so the curve is the batch's cost alone
CONTEXT_SUFFIX_TOKENS = 128  # new tokens of a streamed turn (a page chunk and a question, scaled)
_FIRST_ID = 100  # skip the low ids where tokenizers keep their special tokens


class CalibrationError(ValueError):
    """Bad calibration parameters."""


def default_output(model: str, platform_name: str = "cpu") -> Path:
    return cache_path("cost_model", f"{Path(model).name}-{platform_name}.json")


def random_prompt(rng: np.random.Generator, vocab_size: int, num_tokens: int) -> list[int]:
    return [int(t) for t in rng.integers(_FIRST_ID, vocab_size, size=num_tokens)]


async def time_to_first_token(engine, prompt: list[int], max_tokens: int = 1, salt: str | None = None) -> float:
    """Seconds from submission to the first sampled token; a fresh salt (default) reuses no cache."""
    started = time.perf_counter()
    first = None
    async for delta in engine.generate(token_ids=prompt, sampling=SamplingConfig(max_tokens=max_tokens),
                                       cache_salt=salt or uuid.uuid4().hex):
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


async def measure_swap_in(engine, sizes, repeats: int, rng, vocab_size: int, block_size: int,
                          settle_s: float = 0.5) -> list[tuple[int, float]]:
    """Seconds to load N tokens' KV back from the host pool (engines with KV offloading only).

    Per size: prefill a prompt (its blocks are offloaded as they fill), drop the device prefix
    cache, run it again (the blocks load from host memory), and run it a third time (all blocks
    on the device). Load time = second TTFT - third TTFT: the same one-token prefill and decode
    step in both, the difference is the transfer.
    """
    pairs: dict[int, list[float]] = {size: [] for size in sizes}
    for _ in range(repeats):
        for size in sizes:
            prompt, salt = random_prompt(rng, vocab_size, size), uuid.uuid4().hex
            await time_to_first_token(engine, prompt, salt=salt)
            await asyncio.sleep(settle_s)  # offloading stores run behind the forward pass
            await engine.drop_device_prefix_cache()
            loaded = await time_to_first_token(engine, prompt, salt=salt)
            resident = await time_to_first_token(engine, prompt, salt=salt)
            pairs[size].append(max(0.0, loaded - resident))
    return [(-(-size // block_size), statistics.median(values)) for size, values in pairs.items()]


async def measure_prefill_context(engine, sizes, repeats: int, rng, vocab_size: int, block_size: int,
                                  max_model_len: int) -> list[tuple[int, float]]:
    """(new x cached token pairs, extra seconds) for CONTEXT_SUFFIX_TOKENS new tokens after each
    cached prefix in `sizes` that fits; only whole blocks are cached, so pairs count those."""
    contexts = [k for k in sizes if k >= block_size and k + CONTEXT_SUFFIX_TOKENS + 1 <= max_model_len]
    extras: dict[int, list[float]] = {}
    for _ in range(repeats):
        for context in contexts:
            cached = context // block_size * block_size
            new = context + CONTEXT_SUFFIX_TOKENS - cached
            prefix, salt = random_prompt(rng, vocab_size, context), uuid.uuid4().hex
            await time_to_first_token(engine, prefix, salt=salt)
            after_prefix = await time_to_first_token(
                engine, prefix + random_prompt(rng, vocab_size, CONTEXT_SUFFIX_TOKENS), salt=salt)
            fresh = await time_to_first_token(engine, random_prompt(rng, vocab_size, new))
            extras.setdefault(new * cached, []).append(max(0.0, after_prefix - fresh))
    return [(pairs, statistics.median(values)) for pairs, values in sorted(extras.items())]


async def measure_decode_context(engine, sizes, repeats: int, rng, vocab_size: int,
                                 max_model_len: int) -> list[tuple[int, float]]:
    """(context tokens beyond DECODE_PROMPT_TOKENS, extra seconds per decode step) at batch 1."""
    contexts = [k for k in sizes if DECODE_PROMPT_TOKENS < k <= max_model_len - DECODE_TOKENS - 1]
    gaps: dict[int, list[float]] = {}
    for _ in range(repeats):
        for context in (DECODE_PROMPT_TOKENS, *contexts):
            times = await _token_times(engine, random_prompt(rng, vocab_size, context))
            gaps.setdefault(context, []).extend(b - a for a, b in zip(times, times[1:]))
    if not gaps.get(DECODE_PROMPT_TOKENS):
        return []
    base = statistics.median(gaps[DECODE_PROMPT_TOKENS])
    return [(context - DECODE_PROMPT_TOKENS, max(0.0, statistics.median(gaps[context]) - base))
            for context in contexts if gaps.get(context)]


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
        runs = await asyncio.gather(*(_token_times(engine, random_prompt(rng, vocab_size, DECODE_PROMPT_TOKENS))
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
    prefill_context = await measure_prefill_context(engine, sorted(sizes), repeats, rng, vocab, block_size,
                                                    config.max_model_len)
    decode_context = (await measure_decode_context(engine, sorted(sizes), repeats, rng, vocab,
                                                   config.max_model_len) if batches else [])
    swap_in = []
    if config.kv_offload_gib is not None:
        swap_in = await measure_swap_in(engine, sorted(sizes), repeats, rng, vocab, block_size)
    swap_note = ("swap_in = TTFT after dropping the device prefix cache minus TTFT with the KV resident "
                 "(median); swap_out set equal to swap_in (stores overlap the forward pass and are "
                 "not timed separately)" if swap_in else
                 "swap unavailable: no KV offloading on this engine (vLLM's is CUDA-only)")
    return build_cost_model(
        recompute, decode_step=decode, block_size=block_size, model=config.model,
        swap_out=swap_in, swap_in=swap_in, prefill_context=prefill_context,
        decode_context=decode_context, decode_base_context=DECODE_PROMPT_TOKENS + DECODE_TOKENS // 2,
        device=f"{'cuda' if swap_in else 'cpu'} ({platform.machine()}, {platform.node()})",
        notes=(f"stream2llm calibrate: recompute = time to first token of N fresh tokens "
               f"(median of {repeats} runs), max_num_batched_tokens={config.max_num_batched_tokens}; "
               f"decode = median inter-token gap at batch B; prefill_context = TTFT of "
               f"{CONTEXT_SUFFIX_TOKENS} tokens after a cached prefix minus TTFT of as many fresh ones; "
               f"decode_context = batch-1 gap at a long context minus at {DECODE_PROMPT_TOKENS} tokens; "
               f"{swap_note}"),
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
