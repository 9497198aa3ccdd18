"""What the HTTP routes do, as async generators of (event, data, id) triples; no HTTP here.

`answer_events` decodes a session that already holds its context; `rag_events` streams a source's
context into a fresh session while retrieval runs, then answers. For retriever sources the replica
pulls the retriever actor's stream itself and sends back summaries: the ingress never sees chunk
text. An error during retrieval aborts the session. A retrieval that loses its reader (a
cancellation: the client left, or this ingress is going down) is detached: its replica keeps the
session for `limits.resume_grace_s`, so that a reconnect with `Last-Event-ID` (the id of the last
event the client got: `<session>.<replica>.c<position>`) is taken over by any ingress
(`pipeline.ingress.takeover`), then aborts it (an inline source's session is aborted at once: a
take-over runs it again). An answer that loses its reader keeps running on its replica for the same
grace, so that a reconnect with the answer event's id (`<session>.<replica>.<tokens so far>`) gets
the rest from there.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeline.replica.answers import AnswerEnd
from pipeline.ingress.cleanup import cleanup
from pipeline.errors import ContextLimitExceeded, LimitExceeded, SessionGone, is_replica_gone, unwrap
from pipeline.sessions.log import SessionLog
from pipeline.sources import (AppendChunk, Done, ReplaceContext, SourceError, citation, context_change,
                              open_source, source_type)
from stream2llm.data.traces import ContextOp

if TYPE_CHECKING:
    from pipeline.ingress.replica_client import EngineClient
    from pipeline.ingress.metrics import PipelineMetrics
    from pipeline.ingress.prompt import PromptTemplate
    from pipeline.ingress.retriever_actors import RetrieverActors
    from pipeline.sessions.store import SessionStore


INLINE_SOURCES = ("documents", "corpus")  # built in the ingress (client-side retrieval)


@dataclass(frozen=True)
class FlowContext:
    """What a flow uses of its ingress replica, handed over by it: nothing else is reached for."""

    client: EngineClient
    sessions: SessionStore
    metrics: PipelineMetrics
    actors: RetrieverActors
    template: PromptTemplate
    context_limit: int  # tokens a session may hold (AppConfig.context_limit)
    owner: str | None = None  # this ingress replica's actor name: owner of the sessions it drives alone


def answer_event_id(session_id: str, replica_id: str, tokens: int) -> str:
    return f"{session_id}.{replica_id}.{tokens}"


def parse_event_id(event_id: str) -> tuple[str, str, int] | None:
    """(session id, replica id, answer tokens already received), or None for a non-answer id."""
    parts = event_id.strip().split(".")
    if len(parts) != 3 or not parts[2].isdigit():
        return None
    return parts[0], parts[1], int(parts[2])


def context_event_id(session: SessionLog, position: int) -> str:
    """`<session>.<replica>.c<position>`: the session event is c0; a retriever source's context
    events carry their position in the replica's context log, an inline source's their count."""
    return f"{session.session_id}.{session.replica_id}.c{position}"


def parse_context_event_id(event_id: str) -> tuple[str, str, int] | None:
    """(session id, replica id, context position), or None for an id of another kind."""
    parts = event_id.strip().split(".")
    if len(parts) != 3 or not parts[2].startswith("c") or not parts[2][1:].isdigit():
        return None
    return parts[0], parts[1], int(parts[2][1:])


async def answer_events(ctx: FlowContext, session: SessionLog, question: str, sampling: dict, endpoint: str,
                        or_resume: bool = False):
    """Yield ("token", delta, id) ... ("final", summary, id); the session is finished either way.
    `or_resume`: the session was taken over, and an answer its first ingress started is sent whole."""
    finished = answering = False
    try:
        async with session.lock:
            session.touch()
            stats: dict = {}
            answer = ctx.client.finish(session, question, sampling, or_resume=or_resume)
            async for event in token_events(answer, stats, session):
                answering = True
                yield event
            finished = True
        ctx.metrics.observe_final(endpoint, stats)
        if session.recovered:
            ctx.metrics.recovered.inc()
        yield "final", final_event(session, stats), answer_event_id(
            session.session_id, session.replica_id, stats.get("output_tokens") or 0)
    except Exception:  # not a lost reader (that is a cancellation): nobody resumes this answer
        await cleanup(ctx.client.abort_quietly(session))
        raise
    except asyncio.CancelledError:
        # The reader left. Once an answer event reached it, the replica keeps the answer for a
        # reconnect (resume grace); before that, nobody can resume, and the finish call may not
        # even have reached the replica, which would hold the session until its idle TTL.
        if not answering:
            await cleanup(ctx.client.abort_quietly(session))
        raise
    finally:
        if not finished:  # its replica ends the answer (done, or no reader within the grace period)
            ctx.metrics.aborted.labels("cut_short").inc()
        ctx.client.release(session, session.context_tokens if finished else None)


async def token_events(items, stats: dict, session: SessionLog | None = None):
    """Relay a replica's answer items as ("token", delta, id) events; its closing stats land in
    `stats`. Ids name the replica holding the answer (resumable there) when a session is given."""
    async for item in items:
        if isinstance(item, AnswerEnd):
            stats.update(item.stats)
            return
        event_id = None if session is None else answer_event_id(session.session_id, session.replica_id,
                                                                item.tokens)
        yield "token", {"text": item.text, "token_ids": item.token_ids, "finish_reason": item.finish_reason}, event_id


async def resume_events(ctx: FlowContext, session_id: str, replica_id: str, after_tokens: int):
    """The rest of an answer from the replica that holds it (any ingress can serve this). An answer
    dies with that replica: a resume holds no context to recover it with, so the client is told to
    ask again (`SessionGone`, 404), whether the replica is gone before or during the resume."""
    session = SessionLog(session_id, "", replica_id)
    stats: dict = {}
    try:
        async for event in token_events(ctx.client.resume(session, after_tokens), stats, session):
            yield event
    except Exception as e:
        if not is_replica_gone(e):
            raise
        raise SessionGone(f"the answer of session {session_id!r} was lost with its replica {replica_id}: "
                          "ask again") from None
    yield "final", {**final_event(session, stats), "resumed": True}, answer_event_id(
        session_id, replica_id, stats.get("output_tokens") or 0)


def final_event(session: SessionLog, stats: dict) -> dict:
    return {
        "session_id": session.session_id,
        "replica_id": stats.get("replica_id", session.replica_id),
        "node_id": stats.get("node_id", session.node_id),
        "recovered": session.recovered > 0,
        "citations": session.sources,
        "ttft_s": stats.get("ttft_s"),
        "tokens_prefilled_before_finish": stats.get("tokens_prefilled_before_finish"),
        "tokens_invalidated": stats.get("tokens_invalidated"),
        "context_tokens": stats.get("context_tokens", session.context_tokens),
        "output_tokens": stats.get("output_tokens"),
        "chunks": session.chunks,
        "open_s": round(time.time() - session.created_at, 4),
    }


async def rag_events(ctx: FlowContext, request, skip: int = 0):
    """Open a session, say its id (a `session` event: with it a client whose stream is cut can
    reconnect), stream the source's context into it as it arrives, then answer. `skip`: the client
    has the first `skip` context events of this (inline, so deterministic) source already."""
    started = time.monotonic()
    inline = request.source.type in INLINE_SOURCES
    call = None if inline else await ctx.actors.call(request.source, request.question)  # a bad source: 4xx
    session = await ctx.client.open(source_type(request.source), owner=ctx.owner)
    context = _context(ctx, session, request, call, skip)
    async for item in drive_session(ctx, session, request, started, _announced(session, context, inline)):
        yield item


async def _announced(session: SessionLog, context, inline: bool):
    """The `session` event, then the context events. An inline source's first event is made first:
    a bad document id must still be answered with a status code (400), not an error event."""
    first = await anext(context, None) if inline else None
    yield "session", {"session_id": session.session_id, "replica_id": session.replica_id}, context_event_id(session, 0)
    if first is not None:
        yield first
    async for item in context:
        yield item


async def drive_session(ctx: FlowContext, session: SessionLog, request, started: float, context, or_resume: bool = False):
    """The session's context events, then its answer. Ended before the answer by an error, the
    session is aborted; by a lost reader (a cancellation: the client left, or this ingress is going
    down), a retriever source's session is left to its replica for a take-over (`detach`), an
    inline one (run again on a take-over) is aborted."""
    handed_over = False
    try:
        async with session.lock:
            async for item in context:
                yield item
        retrieval_s = time.monotonic() - started
        handed_over = True
        sampling = request.sampling.model_dump()
        async for name, data, event_id in answer_events(ctx, session, ctx.template.footer(request.question),
                                                        sampling, "rag", or_resume=or_resume):
            if name == "final":
                data = {**data, "retrieval_s": round(retrieval_s, 4)}
            yield name, data, event_id
    except asyncio.CancelledError:
        if not handed_over and request.source.type not in INLINE_SOURCES:
            handed_over = True
            await cleanup(ctx.client.detach_quietly(session))
        raise
    finally:
        if not handed_over:
            await cleanup(ctx.client.abort_quietly(session))


async def _context(ctx: FlowContext, session: SessionLog, request, call, skip: int = 0):
    """Context events with ids: from the replica (retriever sources: `call`) or built here (inline)."""
    if call is not None:
        async for item in with_context_ids(session, replica_context(ctx, session, call)):
            yield item
        return
    await ctx.client.add(session, ContextOp.APPEND, ctx.template.header)
    n = 0
    async for name, data in _inline_context(ctx, session, open_source(request.source, request.question, ctx.actors)):
        n += 1
        if n > skip:
            yield name, data, context_event_id(session, n)


async def with_context_ids(session: SessionLog, events):
    """A retriever source's events, each with its position in the replica's context log as id."""
    async for name, data in events:
        yield name, data, context_event_id(session, session.context_pos)


async def _inline_context(ctx: FlowContext, session: SessionLog, events):
    async def add(session: SessionLog, op: ContextOp, text: str) -> int:
        ctx.metrics.ingress_chunk_bytes.inc(len(text.encode()))  # inline sources' text passes here
        return await ctx.client.add(session, op, text)

    async for item in context_items(ctx, session, events, add):
        yield item


async def context_items(ctx: FlowContext, session: SessionLog, events, add):
    """The (event, data) pairs of retrieval `events` applied to the session with `add`, up to
    the retrieval's end (`Done`)."""
    async for event in events:
        item = await context_event(ctx, session, event, add)
        if item is not None:
            yield item
        if isinstance(event, Done):
            return


async def replica_context(ctx: FlowContext, session: SessionLog, call, after: int = 0):
    """The replica's summaries (the client's citations kept by `ctx.client.stream_context`)."""
    async for name, data in ctx.client.stream_context(session, call, after):
        if name == "context":
            ctx.metrics.replica_chunks.inc()
        yield name, data


async def context_event(ctx: FlowContext, session: SessionLog, event, add):
    """Forward one retrieval event with `add(session, op, text) -> context tokens`; the
    (event, data) pair to send to the client, or None."""
    if isinstance(event, SourceError):
        return "source_error", {"source": event.source, "reason": event.reason}
    if isinstance(event, Done):
        return "retrieval_done", dict(event.summary)
    if not isinstance(event, (AppendChunk, ReplaceContext)):
        return None
    op, text = context_change(event, ctx.template.header)
    try:
        ctx.sessions.check_chunk_room(session)
        tokens = await add(session, op, text)
    except Exception as e:
        # Over a limit: the session keeps the context it has and the answer uses that.
        if not isinstance(unwrap(e), (LimitExceeded, ContextLimitExceeded)):
            raise
        return "context_skipped", {"mode": op, "sources": citation(event), "reason": str(unwrap(e))}
    session.cite(op, citation(event))
    return "context", {"mode": op, "sources": citation(event), "context_tokens": tokens}
