"""Streamed sessions produce exactly the greedy output of the one-shot prompt (real vLLM on CPU)."""

import uuid

import pytest

from engine.api import SamplingConfig
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
    await tiny_engine.update(sid, token_ids=second)
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
