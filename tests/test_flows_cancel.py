"""A reader that leaves before the first answer event: the session is aborted on its replica (the
finish call may never have reached it, and nobody can resume an answer they have no event id of);
one that leaves after it: the answer stays for a reconnect. A resume whose replica is lost is told
to ask again. A reader that leaves mid-retrieval: a retriever source's session is detached (kept
by its replica for a take-over), an inline one aborted. Stand-in engine client (the logic above it), real metrics."""

import asyncio
from types import SimpleNamespace

from pipeline.replica.answers import AnswerPiece
from pipeline.errors import SessionGone, http_status
from pipeline.ingress.flows import FlowContext, answer_events, drive_session, resume_events
from pipeline.ingress.metrics import PipelineMetrics
from pipeline.sessions.log import SessionLog


class _Client:
    def __init__(self, tokens_before_stall: int):
        self.tokens, self.aborted, self.released = tokens_before_stall, [], []
        self.stalled = asyncio.Event()

    async def finish(self, session, question, sampling, or_resume=False):
        for i in range(self.tokens):
            yield AnswerPiece(text=f"t{i}", token_ids=[i], finish_reason=None, tokens=i + 1)
        self.stalled.set()
        await asyncio.Event().wait()  # the replica has not answered (yet)

    async def abort_quietly(self, session):
        self.aborted.append(session.session_id)
        return True

    def release(self, session, context_tokens):
        self.released.append(session.session_id)


def _leave_after(events_read: int, tokens_before_stall: int):
    async def scenario():
        client = _Client(tokens_before_stall)
        ctx = FlowContext(client, None, PipelineMetrics(), None, None, 100)
        session = SessionLog("s1", "client", "r1")
        events = answer_events(ctx, session, "q?", {}, "rag")

        async def read():
            for _ in range(events_read):
                await events.__anext__()
            await events.__anext__()  # waits for an answer event that does not come

        reader = asyncio.create_task(read())
        await asyncio.wait_for(client.stalled.wait(), timeout=30)  # the reader waits on the answer
        reader.cancel()  # the client left: its request is cancelled
        await asyncio.gather(reader, return_exceptions=True)  # it awaited its (detached) clean-up
        return client

    return asyncio.run(scenario())


def test_a_reader_gone_before_the_first_answer_event_aborts_the_session():
    client = _leave_after(events_read=0, tokens_before_stall=0)
    assert client.aborted == ["s1"] and client.released == ["s1"]


def test_a_reader_gone_after_an_answer_event_leaves_the_answer_for_a_reconnect():
    client = _leave_after(events_read=1, tokens_before_stall=1)
    assert client.aborted == [] and client.released == ["s1"]


class _LostReplicaClient:
    """The replica holding the answer dies after `tokens` tokens of the resume."""

    def __init__(self, tokens: int):
        self.tokens = tokens

    async def resume(self, session, after_tokens):
        from ray.exceptions import ActorDiedError

        for i in range(self.tokens):
            yield AnswerPiece(text=f"t{i}", token_ids=[i], finish_reason=None, tokens=after_tokens + i + 1)
        raise ActorDiedError()


def _resume_until_lost(tokens: int) -> tuple[list, BaseException]:
    async def scenario():
        ctx = FlowContext(_LostReplicaClient(tokens), None, PipelineMetrics(), None, None, 100)
        events = []
        try:
            async for event in resume_events(ctx, "s1", "r1", 3):
                events.append(event)
        except Exception as e:  # noqa: BLE001 - the error is what is asserted
            return events, e
        raise AssertionError("the resume ended without an error")

    return asyncio.run(scenario())


def test_a_resume_whose_replica_is_lost_says_the_session_is_gone():
    for tokens in (0, 2):  # the replica gone before the resume reached it, or during it
        events, error = _resume_until_lost(tokens)
        assert [e[2] for e in events] == [f"s1.r1.{4 + i}" for i in range(tokens)]
        assert isinstance(error, SessionGone) and http_status(error) == 404, error
        assert "ask again" in str(error)


class _RetrievalClient(_Client):
    """A session mid-retrieval: one context event, then the retrieval waits."""

    def __init__(self):
        super().__init__(0)
        self.detached: list[str] = []

    async def detach_quietly(self, session):
        self.detached.append(session.session_id)


def _leave_mid_retrieval(source_type: str) -> _RetrievalClient:
    async def scenario():
        client = _RetrievalClient()
        ctx = FlowContext(client, None, PipelineMetrics(), None, None, 100)
        session = SessionLog("s1", source_type, "r1")
        request = SimpleNamespace(source=SimpleNamespace(type=source_type), question="q?",
                                  sampling=SimpleNamespace(model_dump=dict))

        async def context():
            yield "context", {}, "s1.r1.c1"
            client.stalled.set()
            await asyncio.Event().wait()  # the next piece has not been retrieved yet

        events = drive_session(ctx, session, request, 0.0, context())
        reader = asyncio.create_task(events.__anext__())
        await reader
        reader = asyncio.create_task(events.__anext__())
        await asyncio.wait_for(client.stalled.wait(), timeout=30)
        reader.cancel()  # the client left, or this ingress is going down
        await asyncio.gather(reader, return_exceptions=True)
        return client

    return asyncio.run(scenario())


def test_a_retrieval_that_loses_its_reader_is_detached_for_a_take_over_and_an_inline_one_aborted():
    retriever = _leave_mid_retrieval("trace")
    assert retriever.detached == ["s1"] and retriever.aborted == [] and retriever.released == []
    inline = _leave_mid_retrieval("documents")  # a take-over runs it again: nothing to keep
    assert inline.detached == [] and inline.aborted == ["s1"]
