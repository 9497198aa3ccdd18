"""A `/v1/rag` session taken over by another ingress after the one driving it died before the
answer (`takeover_events`), for a client that reconnected with `Last-Event-ID`."""

from __future__ import annotations

import time

from pipeline.ingress.cleanup import cleanup
from pipeline.ingress.flows import (INLINE_SOURCES, FlowContext, drive_session, replica_context, with_context_ids,
                                    rag_events)
from pipeline.sessions.log import SessionLog
from pipeline.sources import source_type


async def takeover_events(ctx: FlowContext, request, session_id: str, replica_id: str, position: int):
    """The rest of a `/v1/rag` session whose ingress died, for a client that reconnected with the id
    of the last event it got before the answer (`Last-Event-ID`: `context_event_id`). The replica
    still holds it: its retrieval went on there (`pipeline.replica.context_log`); this ingress
    takes it over, sends the context events after `position`, then the answer (the whole of one the
    first ingress had started). An inline source runs again in a new session, its first `position`
    events skipped (the same documents give the same events). `SessionGone` (404) when the replica
    was lost too: nothing holds the session (ask again)."""
    started = time.monotonic()
    session = SessionLog(session_id, source_type(request.source), replica_id, owner=ctx.owner)
    state = await ctx.client.take_over(session)
    if request.source.type in INLINE_SOURCES and not state["answering"]:
        await cleanup(ctx.client.abort_quietly(session))
        async for item in rag_events(ctx, request, skip=position):
            yield item
        return
    if state["answering"]:
        context = _nothing()
    else:
        call = await ctx.actors.call(request.source, request.question)
        context = with_context_ids(session, replica_context(ctx, session, call, after=position))
    async for item in drive_session(ctx, session, request, started, context, or_resume=True):
        yield item


async def _nothing():
    return
    yield  # an async generator with no items
