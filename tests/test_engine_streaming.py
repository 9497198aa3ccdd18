"""Streamed sessions produce exactly the greedy output of the one-shot prompt (real vLLM on CPU);
races of abort with update and finish; a seeded question."""

import asyncio
import uuid

import pytest

from engine.api import SamplingConfig, SessionNotFoundError
from tests.conftest import collect, wait_for_kv_blocks

GREEDY = SamplingConfig(max_tokens=24)


def _pieces(engine, n: int, words: int = 40) -> list[list[int]]:
    return [engine.tokenize(" ".join(f"doc{i} word{j} value{(i * 7 + j) % 13}" for j in range(words)))
            for i in range(n)]


async def _one_shot(engine, ids):
    out, _ = await collect(engine.generate(token_ids=ids, sampling=GREEDY, cache_salt=uuid.uuid4().hex))
    return out


async def test_append_matches_one_shot(tiny_engine):
    pieces = _pieces(tiny_engine, 5)
    question = tiny_engine.tokenize("Question: which value comes first?")
    sid = await tiny_engine.open_session()
    for piece in pieces:
        await tiny_engine.append(sid, token_ids=piece)
    streamed, _ = await collect(tiny_engine.finish(sid, token_ids=question, sampling=GREEDY))
    expected = await _one_shot(tiny_engine, sum(pieces, []) + question)
    assert len(streamed) == GREEDY.max_tokens
    assert streamed == expected
    stats = tiny_engine.session_stats(sid)
    assert stats.chunks == 5 and stats.output_tokens == GREEDY.max_tokens
    assert stats.ttft_s is not None and stats.ttft_s > 0


async def test_prefill_happens_before_finish(tiny_engine):
    pieces = _pieces(tiny_engine, 3)
    sid = await tiny_engine.open_session()
    for piece in pieces:
        await tiny_engine.append(sid, token_ids=piece)
    assert await tiny_engine.wait_prefilled(sid) == sum(map(len, pieces))
    await collect(tiny_engine.finish(sid, "Question: ok?", sampling=GREEDY))
    assert tiny_engine.session_stats(sid).tokens_prefilled_before_finish == sum(map(len, pieces))


@pytest.mark.parametrize("pattern", ["tail", "middle", "full", "extend"])
async def test_update_matches_one_shot_and_reuses_prefix(tiny_engine, pattern):
    a, b, c, d, e = _pieces(tiny_engine, 5, words=30)
    first = a + b + c
    second = {"tail": a + b + d, "middle": a + d + c, "full": e + d, "extend": a + b + c + d}[pattern]
    question = tiny_engine.tokenize("Question: what changed?")
    sid = await tiny_engine.open_session()
    await tiny_engine.append(sid, token_ids=first)
    await tiny_engine.wait_prefilled(sid)
    await tiny_engine.replace(sid, token_ids=second)
    await tiny_engine.wait_prefilled(sid)
    streamed, _ = await collect(tiny_engine.finish(sid, token_ids=question, sampling=GREEDY))
    assert streamed == await _one_shot(tiny_engine, second + question)

    lcp = next((i for i, (x, y) in enumerate(zip(first, second)) if x != y), min(len(first), len(second)))
    stats = tiny_engine.session_stats(sid)
    assert stats.tokens_invalidated == len(first) - lcp
    block = (await tiny_engine.stats()).block_size
    # Only what follows the common prefix is prefilled again, plus at most one partial block.
    assert stats.tokens_recomputed <= len(second) - lcp + block
    if pattern in ("tail", "middle"):
        assert stats.tokens_recomputed < len(second) - block  # the prefix really was reused


async def test_kv_returns_to_baseline_after_close_abort_and_disconnect(tiny_engine):
    baseline = await wait_for_kv_blocks(tiny_engine, 0)
    assert baseline == 0
    piece = _pieces(tiny_engine, 1, words=200)[0]

    sid = await tiny_engine.open_session()
    await tiny_engine.append(sid, token_ids=piece)
    await tiny_engine.wait_prefilled(sid)
    assert (await tiny_engine.stats()).kv_blocks_used > 0
    await tiny_engine.abort(sid)
    assert await wait_for_kv_blocks(tiny_engine, 0) == 0

    sid = await tiny_engine.open_session()
    await tiny_engine.append(sid, token_ids=piece)
    answer = tiny_engine.finish(sid, "Question: go on", sampling=SamplingConfig(max_tokens=200))
    await answer.__anext__()
    await answer.aclose()  # the consumer went away mid-answer
    assert await wait_for_kv_blocks(tiny_engine, 0) == 0
    assert (await tiny_engine.stats()).sessions_active == 0


async def test_abort_racing_update_and_finish_leaves_nothing_behind(tiny_engine):
    engine = tiny_engine
    sid = await engine.open_session()
    await engine.append(sid, text="alpha beta gamma delta " * 20)
    await engine.wait_prefilled(sid)
    # update and abort at once: no request may outlive the aborted session
    await asyncio.gather(engine.replace(sid, text="alpha beta " * 30), engine.abort(sid),
                         return_exceptions=True)
    with pytest.raises(SessionNotFoundError):
        await engine.append(sid, text="more")
    # abort while the answer streams: the reader ends (reason "abort") instead of waiting forever
    sid = await engine.open_session()
    await engine.append(sid, text="one two three " * 10)
    deltas = engine.finish(sid, question="Question?", sampling=SamplingConfig(max_tokens=400))
    reasons = []

    async def read():
        async for delta in deltas:
            if not reasons:
                reasons.append("first")
                await engine.abort(sid)
            if delta.finished:
                reasons.append(delta.finish_reason)

    await asyncio.wait_for(read(), timeout=60)
    assert reasons[-1] in ("abort", "length")
    assert await wait_for_kv_blocks(engine, 0, timeout_s=30) == 0


async def test_seed_on_the_final_question_is_honoured(tiny_engine):
    engine = tiny_engine
    context = engine.tokenize("seed test context " * 12)
    question = engine.tokenize("Question: what next?")
    sampling = SamplingConfig(max_tokens=12, temperature=1.0, seed=1234)
    answers = []
    for _ in range(2):
        sid = await engine.open_session()
        await engine.append(sid, token_ids=context)
        await engine.wait_prefilled(sid)
        ids, _ = await collect(engine.finish(sid, token_ids=question, sampling=sampling))
        answers.append(ids)
    one_shot, _ = await collect(engine.generate(token_ids=context + question, sampling=sampling))
    assert answers[0] == answers[1] == one_shot and one_shot
    assert await wait_for_kv_blocks(engine, 0, timeout_s=30) == 0
