"""The replica-side data plane without Ray: the retriever pump, answer coalescing, answer logs
(resume by token cursor, grace-period cancellation), event ids and the router's wait rule.

The engine here is a small fake behind the `StreamingEngine` calls the pump makes (append, update,
session_stats); the pipeline tests run the real engine.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from pipeline.replica.answers import AnswerCancelled, AnswerEnd, AnswerLog, AnswerLogs, AnswerPiece
from pipeline.errors import AnswerDiverged
from pipeline.ingress.flows import answer_event_id, parse_event_id
from pipeline.replica.context import ContextLimits, coalesce, pump, settle_replacements
from pipeline.control.router import _waits_for
from retrievers.events import AppendChunk, Chunk, Done, ReplaceContext, SourceError
from stream2llm.data.traces import ContextOp


class FakeEngine:
    def __init__(self):
        self.context: list[int] = []
        self.calls: list[str] = []

    async def append(self, session_id, token_ids):
        return await self.change_context(session_id, ContextOp.APPEND, token_ids=token_ids)

    async def change_context(self, session_id, op, token_ids):
        self.calls.append(op)
        self.context = (self.context if op == ContextOp.APPEND else []) + list(token_ids)
        return len(self.context)

    def session_stats(self, session_id):
        return SimpleNamespace(context_tokens=len(self.context))


async def _words(text: str) -> list[int]:
    return [len(w) for w in text.split()]


async def _events(items):
    for item in items:
        yield item


def _run(coro):
    return asyncio.run(coro)


def test_pump_prefills_pieces_and_yields_summaries_without_text():
    engine = FakeEngine()
    chunk = Chunk("b c", "s2", "doc2", "T2")
    events = [AppendChunk("a a a", "s1", "doc1", "T1"), SourceError("http://x", "timeout"),
              ReplaceContext((chunk,)), AppendChunk("x " * 50, "s3", "doc3", "T3"), Done({"chunks": 2})]

    async def go():
        return [i async for i in pump(engine, _words, "sid", "head er", _events(events), ContextLimits(5, 20))]

    out = _run(go())
    names = [n for n, _ in out]
    assert names == ["context", "source_error", "context", "context_skipped", "retrieval_done"]
    assert engine.calls == ["append", "append", "replace"]  # header, piece, replace; the big piece skipped
    assert out[0][1]["sources"][0]["source_id"] == "s1" and "text" not in out[0][1]
    assert out[2][1]["mode"] == "replace" and out[2][1]["context_tokens"] == len(engine.context)
    assert "exceeds the limit of 20" in out[3][1]["reason"]
    keys = [data.get("key") for _, data in out]  # content identities: a rerun is matched by these
    assert all(keys[:4]) and len(set(keys[:4])) == 4 and keys[4] is None


def test_pump_counts_the_chunk_limit():
    engine = FakeEngine()
    events = [AppendChunk(f"w{i}", f"s{i}", "d", "t") for i in range(3)] + [Done()]

    async def go():
        return [n async for n, _ in pump(engine, _words, "sid", "h", _events(events), ContextLimits(2, 999))]

    assert _run(go()) == ["context", "context", "context_skipped", "retrieval_done"]


def _delta(i, finished=False):
    return AnswerPiece(f"t{i}", [i], "length" if finished else None)


def test_coalesce_merges_what_waits_and_keeps_every_token_in_order():
    async def burst():
        for i in range(20):
            yield _delta(i, finished=i == 19)

    async def go():
        return [item async for item in coalesce(burst(), window_s=0.05)]

    items = _run(go())
    assert [t for i in items for t in i.token_ids] == list(range(20))
    assert "".join(i.text for i in items) == "".join(f"t{i}" for i in range(20))
    assert len(items) < 20 and items[-1].finish_reason == "length"
    assert all(i.finish_reason is None for i in items[:-1])


def test_coalesce_joins_sse_lines_and_passes_other_items_in_order():
    """The OpenAI route's stream: a head, SSE lines (joined when they wait), then the timings."""
    async def lines():
        yield "head"
        for i in range(10):
            yield f"data: {i}\n\n"
        yield 42

    async def go():
        is_line = lambda item: isinstance(item, str) and item.startswith("data:")  # noqa: E731
        return [item async for item in coalesce(lines(), window_s=0.05, mergeable=is_line, merge="".join)]

    items = _run(go())
    assert items[0] == "head" and items[-1] == 42 and 3 <= len(items) < 12
    assert "".join(items[1:-1]) == "".join(f"data: {i}\n\n" for i in range(10))


def test_coalesce_raises_the_producers_error_after_its_items():
    async def failing():
        yield _delta(0)
        raise ValueError("engine broke")

    async def go():
        got = []
        with pytest.raises(ValueError, match="engine broke"):
            async for item in coalesce(failing()):
                got.append(item)
        return got

    assert [i.token_ids for i in _run(go())] == [[0]]


def test_answer_log_resumes_from_a_token_cursor():
    async def answer():
        yield AnswerPiece("ab", [10, 11])
        yield AnswerPiece("c", [12])
        yield AnswerEnd({"output_tokens": 3})

    async def go():
        log = AnswerLog(answer(), grace_s=1.0)
        full = [i async for i in log.tail(0)]
        part = [i async for i in log.tail(1)]
        return full, part

    full, part = _run(go())
    assert [i.token_ids for i in full[:-1]] == [[10, 11], [12]] and full[-1].stats["output_tokens"] == 3
    assert [i.token_ids for i in part[:-1]] == [[11], [12]] and [i.tokens for i in part] == [2, 3, 3]
    assert part[0].text == "" and full[0].text == "ab"  # a cut piece drops its text (it spans tokens)


def test_a_regenerated_answer_is_checked_token_by_token_against_what_was_sent():
    async def answer():
        yield AnswerPiece("ab", [10, 11])
        yield AnswerPiece("cd", [12, 13])
        yield AnswerEnd({"output_tokens": 4})

    async def go(expect):
        log = AnswerLog(answer(), grace_s=1.0)
        try:
            return [i async for i in log.tail(expect=expect)]
        except AnswerDiverged as e:
            return e

    same = _run(go([10, 11, 12]))
    assert [i.token_ids for i in same[:-1]] == [[13]] and [i.tokens for i in same] == [4, 4]
    differs = _run(go([10, 99, 12]))
    assert isinstance(differs, AnswerDiverged) and "at token 1 (sent 99, regenerated 11)" in str(differs)
    shorter = _run(go([10, 11, 12, 13, 14]))
    assert isinstance(shorter, AnswerDiverged) and "ended after 4 tokens" in str(shorter)


def test_answer_nobody_reads_is_cancelled_after_the_grace_period():
    async def go():
        state = {"cancelled": False}
        gate = asyncio.Event()

        async def endless():
            try:
                yield _delta(0)
                await gate.wait()
            except asyncio.CancelledError:
                state["cancelled"] = True
                raise

        logs = AnswerLogs(grace_s=0.05, keep_s=0.0)
        log = logs.start("s", endless())
        async for item in log.tail(0):
            break  # the reader leaves mid-answer
        for _ in range(200):
            if log.done:
                break
            await asyncio.sleep(0.01)
        with pytest.raises(AnswerCancelled):
            async for _ in log.tail(0):
                pass
        logs.expire()
        return state["cancelled"], logs.get("s")

    was_cancelled, left = _run(go())
    assert was_cancelled and left is None


def test_event_ids_round_trip_and_context_ids_are_not_resumable():
    assert parse_event_id(answer_event_id("abc", "r1x", 7)) == ("abc", "r1x", 7)
    assert parse_event_id("abc.c3") is None and parse_event_id("garbage") is None


def _request(method="open_session"):
    import time

    return SimpleNamespace(metadata=SimpleNamespace(call_method=method), created_at=time.time())


def test_router_waits_only_for_a_replica_it_never_listed():
    assert _waits_for(_request(), "new", [], seen={}) is True
    assert _waits_for(_request(), "dead", [], seen={"dead": None}) is False  # listed before: gone
    assert _waits_for(_request("append"), "new", [], seen={}) is False


def test_a_failing_retriever_is_a_source_error_not_a_dead_replica():
    from ray.exceptions import ActorDiedError

    from pipeline.replica.context import RetrieverCall, pull

    async def ok():
        return AppendChunk("a", "s1", "d", "t")

    async def died():
        raise ActorDiedError()

    class Refs:
        def __aiter__(self):
            return self._gen()

        async def _gen(self):
            yield ok()
            yield died()

    actor = SimpleNamespace(stream=SimpleNamespace(remote=lambda *a, **k: Refs()))

    async def go():
        return [e async for e in pull(RetrieverCall(actor, ("q",)))]

    events = _run(go())
    assert isinstance(events[0], AppendChunk) and isinstance(events[1], SourceError)
    assert isinstance(events[2], Done) and events[2].summary["error"] == "ActorDiedError"


def _timed(*steps):
    """An event source: each step is an event, or seconds to wait (asyncio timers fire in order
    whatever the load, so the outcomes below do not depend on the machine's speed)."""
    async def source():
        for step in steps:
            if isinstance(step, (int, float)):
                await asyncio.sleep(step)
            else:
                yield step
    return source()


def _names(events):
    return [getattr(e, "chunks", None) and e.chunks[0].source_id or type(e).__name__ for e in events]


def _settled(source, settle_s):
    async def go():
        return [e async for e in settle_replacements(source, settle_s)]
    return _run(go())


def _replace(name):
    return ReplaceContext((Chunk("t", name, name, name),))


def test_settle_keeps_only_the_last_of_a_burst_of_replacements():
    burst = _timed(_replace("r1"), 0.01, _replace("r2"), 0.01, _replace("r3"), Done({}))
    assert _names(_settled(burst, 0.5)) == ["r3", "Done"]  # the end of retrieval releases r3 at once
    burst = _timed(_replace("r1"), 0.01, _replace("r2"), Done({}))
    assert _names(_settled(burst, 0.0)) == ["r1", "r2", "Done"]  # 0: every replacement


def test_settle_releases_a_replacement_after_a_quiet_spell_and_keeps_the_order():
    source = _timed(_replace("r1"), 0.4, _replace("r2"), AppendChunk("a", "a1", "d", "T"), 0.3, Done({}))
    assert _names(_settled(source, 0.1)) == ["r1", "r2", "AppendChunk", "Done"]


def test_settle_stops_its_source_when_the_reader_leaves():
    state = {"closed": False}

    async def source():
        try:
            yield _replace("r1")
            await asyncio.sleep(3600)
        finally:
            state["closed"] = True

    async def go():
        async for event in settle_replacements(source(), 0.05):
            return event  # the reader leaves after the first settled event

    assert _names([_run(go())]) == ["r1"]
    assert state["closed"]
