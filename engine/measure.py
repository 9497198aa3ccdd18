"""Measure one question both ways on one engine: streamed (chunks prefilled as they arrive) and
one-shot (the whole prompt handed over at once). Shared by the demo and the TTFT benchmark."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from engine.api import SamplingConfig, SessionStats, StreamingEngine


@dataclass
class Measurement:
    answer: str
    answer_ids: list[int]
    stats: SessionStats


async def _drain(deltas) -> tuple[str, list[int]]:
    text, ids = "", []
    async for delta in deltas:
        text += delta.text
        ids.extend(delta.token_ids)
    return text, ids


async def run_streamed(engine: StreamingEngine, chunks: Sequence[list[int]], final: list[int],
                       gap_s: float, sampling: SamplingConfig) -> Measurement:
    """Hand `chunks` over one by one, `gap_s` apart; the question (`final`) follows the last gap."""
    sid = await engine.open_session()
    for chunk in chunks:
        await engine.append(sid, token_ids=chunk)
        await asyncio.sleep(gap_s)
    text, ids = await _drain(engine.finish(sid, token_ids=final, sampling=sampling))
    return Measurement(text, ids, engine.session_stats(sid))


async def run_one_shot(engine: StreamingEngine, prompt: list[int], sampling: SamplingConfig,
                       cache_salt: str | None = None) -> Measurement:
    """The non-streaming baseline: a fresh cache salt so nothing streamed earlier is reused."""
    stats = SessionStats(f"oneshot-{uuid.uuid4().hex[:8]}")
    text, ids = await _drain(engine.generate(token_ids=prompt, sampling=sampling, stats=stats,
                                             cache_salt=cache_salt or uuid.uuid4().hex))
    return Measurement(text, ids, stats)


async def run_floor(engine: StreamingEngine, prefix: list[int], rest: list[int],
                    sampling: SamplingConfig) -> Measurement:
    """The physical limit: `prefix` already cached, so only `rest` is prefilled, then decode."""
    salt = uuid.uuid4().hex
    await run_one_shot(engine, prefix, SamplingConfig(max_tokens=1), cache_salt=salt)
    return await run_one_shot(engine, prefix + rest, sampling, cache_salt=salt)
