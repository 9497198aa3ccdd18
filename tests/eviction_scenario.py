"""One eviction scenario for a running engine (CPU tests and the GPU suite): behaviour, not flags.

`idle` streamed sessions each prefill one chunk of `chunk_tokens` and wait, filling the cache to
about 4.5 chunks; then a one-shot prompt of one chunk arrives and needs the memory of one of them.
Every policy that evicts idle streams ranks them by first arrival or expected next chunk (equal
here: no gap history), so the latest-opened one is the tail of the order and goes first; the
earliest keeps its KV, and the one-shot prompt is never evicted. Then each session asks its
question. Returns every answer and its one-shot answer, and the tokens each recomputed."""

from __future__ import annotations

import uuid

from engine.api import SamplingConfig, SessionStats
from tests.conftest import collect

GREEDY = SamplingConfig(max_tokens=8)
IDLE_SESSIONS = 4
CACHE_CHUNKS = 4.5  # the cache holds this many chunks: the one-shot prompt needs one idle stream's KV


def _tokens(seed: int, n: int) -> list[int]:
    return [200 + (i * 7919 + seed * 104729) % 3000 for i in range(n)]


async def run(engine, chunk_tokens: int) -> dict:
    stats = await engine.stats()
    capacity = stats.kv_blocks_total * stats.block_size
    if not IDLE_SESSIONS * chunk_tokens < capacity < (IDLE_SESSIONS + 1) * chunk_tokens:
        raise AssertionError(f"the cache holds {capacity} tokens: size it to {CACHE_CHUNKS} chunks")
    question = _tokens(99, 12)
    sessions = []
    for i in range(IDLE_SESSIONS):  # opened one after another: their order is fixed
        sid = await engine.open_session()
        await engine.append(sid, token_ids=_tokens(i, chunk_tokens))
        await engine.wait_prefilled(sid)
        sessions.append(sid)
    one_shot_stats = SessionStats("one-shot")
    prompt = _tokens(50, chunk_tokens)
    one_shot = await collect(engine.generate(token_ids=prompt, sampling=GREEDY, stats=one_shot_stats,
                                             cache_salt=uuid.uuid4().hex))
    answers = [await collect(engine.finish(sid, token_ids=question, sampling=GREEDY)) for sid in sessions]
    expected = [await collect(engine.generate(token_ids=_tokens(i, chunk_tokens) + question, sampling=GREEDY,
                                              cache_salt=uuid.uuid4().hex)) for i in range(IDLE_SESSIONS)]
    return {"answers": [a[0] for a in answers], "expected": [e[0] for e in expected],
            "recomputed": [engine.session_stats(sid).tokens_recomputed for sid in sessions],
            "one_shot_tokens": len(one_shot[0]), "one_shot_recomputed": one_shot_stats.tokens_recomputed,
            "preemptions": (await engine.stats()).preemptions}


def assert_evicted_in_policy_order(result: dict) -> None:
    recomputed = result["recomputed"]
    assert result["answers"] == result["expected"]
    assert result["one_shot_tokens"] == GREEDY.max_tokens and result["one_shot_recomputed"] == 0
    assert recomputed[0] == 0 and recomputed[-1] > 0, recomputed  # the earliest kept, the latest evicted
    evicted = [r > 0 for r in recomputed]
    assert evicted == sorted(evicted), recomputed  # only a tail of the order was evicted
