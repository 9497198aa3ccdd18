"""Replay query traces against a real `StreamingEngine` on the wall clock, as the simulator replays
them in simulated time: the same arrivals, chunks, question and answer length, the same TTFT
(from the moment the question, with the last chunk, is handed over to the first answer token)."""

from __future__ import annotations

import asyncio
import time
import uuid

import numpy as np

from bench.stats import percentile
from engine.api import SamplingConfig, SessionStats
from engine.calibration import random_prompt

LEAD_S = 0.2  # time zero lies this far after the start, so the first session is not late


async def _sleep_until(deadline: float) -> None:
    delay = deadline - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


async def _drain(deltas) -> None:
    async for _ in deltas:
        pass


async def _streamed(engine, at, trace, chunks, question) -> SessionStats:
    """Chunks appended when they arrive; the last one goes with the question."""
    await _sleep_until(at(trace.events[0].end_s))
    sid = await engine.open_session()
    for event, chunk in zip(trace.events[:-1], chunks[:-1]):
        await _sleep_until(at(event.end_s))
        await engine.append(sid, token_ids=chunk)
    await _sleep_until(at(trace.events[-1].end_s))
    await _drain(engine.finish(sid, token_ids=chunks[-1] + question,
                               sampling=SamplingConfig(max_tokens=trace.output_tokens)))
    return engine.session_stats(sid)


async def _one_shot(engine, at, trace, chunks, question) -> SessionStats:
    """The whole prompt at the last chunk's arrival, nothing reused from the cache."""
    await _sleep_until(at(trace.events[-1].end_s))
    stats = SessionStats(f"oneshot-{trace.query_id}")
    await _drain(engine.generate(token_ids=sum(chunks, []) + question, stats=stats,
                                 sampling=SamplingConfig(max_tokens=trace.output_tokens),
                                 cache_salt=uuid.uuid4().hex))
    return stats


async def replay(engine, traces, arrivals, streaming: bool, seed: int = 0) -> dict:
    """Replay append-only (crawler) traces; a summary with the simulator's keys."""
    if any(e.kind != "append" for t in traces for e in t.events):
        raise ValueError("the engine replay supports append (crawler) traces only")
    rng = np.random.default_rng(seed)
    vocab = len(engine.tokenizer)
    chunks = [[random_prompt(rng, vocab, e.num_tokens) for e in t.events] for t in traces]
    questions = [random_prompt(rng, vocab, t.question_tokens) for t in traces]
    before = (await engine.stats()).preemptions
    zero = time.monotonic() + LEAD_S
    one = _streamed if streaming else _one_shot
    runs = []
    for trace, start, pieces, question in zip(traces, arrivals, chunks, questions):
        at = (lambda offset, start=start: zero + start + offset)
        runs.append(one(engine, at, trace, pieces, question))
    stats = await asyncio.gather(*runs)
    ttft = [s.ttft_s for s in stats]
    if any(t is None for t in ttft):
        raise RuntimeError("a replayed request produced no token")
    preemptions = (await engine.stats()).preemptions - before
    return {
        "ttft_p50_s": percentile(ttft, 50), "ttft_p95_s": percentile(ttft, 95),
        "ttft_p99_s": percentile(ttft, 99), "ttft_mean_s": float(np.mean(ttft)),
        "makespan_s": max(s.done_at for s in stats) - zero, "preemptions": preemptions,
        "tokens_recomputed": sum(s.tokens_recomputed for s in stats),
        "num_requests": len(stats), "ttft_s": ttft,
        "e2e_s": [s.done_at - s.finish_at for s in stats], "output_tokens": [s.output_tokens for s in stats],
    }
