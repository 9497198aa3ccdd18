"""The replica's context log (`pipeline.replica.context_log`) on its own, plain asyncio: the
retrieval runs in a task of its own, so a tail that leaves (its ingress died) does not stop it, a
second tail (the ingress that took the session over) picks up from a position, and a retrieval
nobody tails for the grace period is cancelled. The real path: tests/test_pipeline_ingress.py."""

import asyncio

import pytest

from pipeline.replica.context_log import ContextCancelled, ContextLogs


async def _retrieval(release: asyncio.Event, pulled: list):
    for i in range(4):
        if i == 2:
            await release.wait()  # the last two pieces come later
        pulled.append(i)
        yield "context", {"i": i}
    yield "retrieval_done", {}


async def _take(tail, n):
    out = []
    async for item in tail:
        out.append(item)
        if len(out) == n:
            break
    return out


def test_a_second_tail_picks_up_after_a_position_and_the_retrieval_outlives_the_first():
    async def main():
        release, pulled = asyncio.Event(), []
        logs = ContextLogs(grace_s=30.0)
        log = logs.start_or_get("s", lambda: _retrieval(release, pulled))
        first = log.tail(0)
        got = await _take(first, 2)
        await first.aclose()  # the first ingress died after two events
        release.set()
        rest = [item async for item in logs.start_or_get("s", lambda: pytest.fail("started twice")).tail(2)]
        return got, rest, pulled

    got, rest, pulled = asyncio.run(main())
    assert [d["pos"] for _, d in got] == [1, 2] and [d["i"] for _, d in got] == [0, 1]
    assert [(n, d["pos"]) for n, d in rest] == [("context", 3), ("context", 4), ("retrieval_done", 5)]
    assert pulled == [0, 1, 2, 3]  # each piece pulled once


def test_a_retrieval_nobody_tails_is_cancelled_after_the_grace():
    async def main():
        release, pulled = asyncio.Event(), []
        logs = ContextLogs(grace_s=0.05)
        log = logs.start_or_get("s", lambda: _retrieval(release, pulled))
        tail = log.tail(0)
        await _take(tail, 1)
        await tail.aclose()
        for _ in range(200):
            if log.done:
                break
            await asyncio.sleep(0.01)
        with pytest.raises(ContextCancelled):
            [item async for item in log.tail(0)]
        return log

    log = asyncio.run(main())
    assert log.done and len(log.items) == 2


def test_ending_a_session_cancels_its_retrieval():
    async def main():
        release, pulled = asyncio.Event(), []
        logs = ContextLogs(grace_s=30.0)
        log = logs.start_or_get("s", lambda: _retrieval(release, pulled))
        await _take(log.tail(0), 2)
        logs.end("s")
        await asyncio.sleep(0)
        release.set()
        await asyncio.sleep(0.01)
        return log, logs, pulled

    log, logs, pulled = asyncio.run(main())
    assert log.done and pulled == [0, 1] and logs.get("s") is None
