"""Session lifecycle regressions, each first found by the state machine test
(tests/test_engine_state_machine.py) and kept here as a plain, named case."""

from __future__ import annotations

import asyncio
import gc
import uuid

import pytest

from engine.api import SessionNotFoundError, SessionStateError
from tests.conftest import wait_for_kv_blocks
from tests.lifecycle_harness import (GREEDY, PIECES, QUESTION, engine_on_thread,  # noqa: F401 - fixture
                                     read_answer, settled)

pytestmark = pytest.mark.timeout(900)


def _ids(engine, *pieces: int) -> list[int]:
    return sum((engine.tokenize(PIECES[p]) for p in pieces), [])


async def _one_shot(engine, context: list[int]) -> list[int]:
    deltas = engine.generate(token_ids=context + engine.tokenize(QUESTION), sampling=GREEDY, cache_salt=uuid.uuid4().hex)
    return (await read_answer(deltas))[0]


def test_a_reader_dropped_unread_ends_the_session(engine_on_thread):
    """Found: an answer dropped before its first read left the session finishing forever (its
    async generator never ran its `finally`); the session counted as active and took no more calls."""
    engine, runner = engine_on_thread

    async def scenario():
        sid = await engine.open_session()
        await engine.append(sid, token_ids=_ids(engine, 2))
        deltas = engine.finish(sid, question=QUESTION, sampling=GREEDY)
        del deltas
        gc.collect()
        await settled(engine)
        with pytest.raises(SessionNotFoundError):
            await engine.append(sid, token_ids=_ids(engine, 0))
    runner.run(scenario())


def test_replace_twice_then_finish_under_pressure_answers(engine_on_thread):
    """Found: with another session holding most of the cache, a session replaced twice and then
    finished waited forever: its replaced requests shared its rank, so the replacement could not
    evict them, and they were only to be closed once the replacement had run."""
    engine, runner = engine_on_thread

    async def scenario():
        holder = await engine.open_session()
        await engine.append(holder, token_ids=_ids(engine, 4, 1))
        sid = await engine.open_session()
        await engine.append(sid, token_ids=_ids(engine, 3))
        await engine.append(sid, token_ids=_ids(engine, 2))
        await engine.replace(sid, token_ids=_ids(engine, 3))
        await engine.replace(sid, token_ids=_ids(engine, 0))
        answer, _ = await read_answer(engine.finish(sid, question=QUESTION, sampling=GREEDY))
        assert answer == await _one_shot(engine, _ids(engine, 0))
        holder_answer, _ = await read_answer(engine.finish(holder, question=QUESTION, sampling=GREEDY))
        assert holder_answer == await _one_shot(engine, _ids(engine, 4, 1))
        await settled(engine)
    runner.run(scenario())


def test_two_aborts_at_once_one_closes_the_other_is_told(engine_on_thread):
    """Found: a session being closed still answered as if it were there: a second abort racing the
    first returned success before the first had freed anything, and input was refused with a state
    error instead of "no such session". An abort racing a finish ends the answer and the session."""
    engine, runner = engine_on_thread

    async def scenario():
        sid = await engine.open_session()
        await engine.append(sid, token_ids=_ids(engine, 3))
        outcomes = await asyncio.gather(engine.abort(sid), engine.abort(sid), return_exceptions=True)
        assert outcomes[0] is None and isinstance(outcomes[1], SessionNotFoundError)
        other = await engine.open_session()
        await engine.append(other, token_ids=_ids(engine, 1))
        deltas = engine.finish(other, question=QUESTION, sampling=GREEDY)
        with pytest.raises(SessionStateError):
            await engine.append(other, token_ids=_ids(engine, 0))
        (answer, reason), aborted = await asyncio.gather(read_answer(deltas), engine.abort(other))
        assert aborted is None and reason in ("abort", "length", "stop")
        assert answer == (await _one_shot(engine, _ids(engine, 1)))[:len(answer)]
        await settled(engine)
    runner.run(scenario())


def test_a_question_queued_behind_a_chunk_that_does_not_fit_is_answered(engine_on_thread):
    """Found: under TailGuard a new stream's context turn takes only free memory; when it did not
    fit, its question waited in vLLM's streaming queue behind it, invisible to the policy, and the
    session was never answered while an idle session held the cache. A queued question now makes
    the session complete, and it evicts the idle one."""
    engine, runner = engine_on_thread

    async def scenario():
        idle = await engine.open_session()
        await engine.append(idle, token_ids=engine.tokenize("[idle] " + PIECES[5]))
        await engine.wait_prefilled(idle)
        sid = await engine.open_session()
        context = engine.tokenize("[asks] " + PIECES[5]) + _ids(engine, 1)
        await engine.append(sid, token_ids=context)
        answer, _ = await read_answer(engine.finish(sid, question=QUESTION, sampling=GREEDY))
        assert answer == await _one_shot(engine, context)
        # the idle session is still open, yet holds no KV: it was evicted for the question
        assert await wait_for_kv_blocks(engine, 0, timeout_s=60.0) == 0 and (await engine.stats()).sessions_active == 1
        await engine.abort(idle)
        await settled(engine)
    runner.run(scenario())
