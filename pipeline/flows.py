"""What the HTTP routes do, as async generators of (event, data) pairs; no HTTP here.

`answer_events` decodes a session that already holds its context; `rag_events` streams a source's
context into a fresh session while retrieval runs, then answers. Any exit other than a complete
answer (error, client disconnect = cancellation) aborts the session so its KV is freed at once.
"""

from __future__ import annotations

import asyncio
import contextvars
import time

from pipeline.errors import LimitExceeded, unwrap
from pipeline.sessions import SessionLog
from pipeline.sources import (AppendChunk, Done, ReplaceContext, SourceError, citation, event_text,
                              open_source, source_type)


async def answer_events(ing, session: SessionLog, question: str, sampling: dict, endpoint: str):
    """Yield ("token", delta) ... ("final", summary) and release the session; abort if cut short."""
    finished = False
    try:
        async with session.lock:
            session.touch()
            stats: dict = {}
            async for event in token_events(ing.client.finish(session, question, sampling), stats):
                yield event
            finished = True
        ing.metrics.observe_final(endpoint, stats)
        if session.recovered:
            ing.metrics.recovered.inc()
        yield "final", final_event(session, stats)
    finally:
        ing.sessions.pop(session.session_id)
        if finished:
            await ing.client.release(session, session.context_tokens)
        else:
            ing.metrics.aborted.labels("cut_short").inc()
            await cleanup(_abort(ing, session))


async def token_events(items, stats: dict):
    """Relay a replica's answer items as ("token", delta) events; its closing stats land in `stats`."""
    async for item in items:
        if "stats" in item:
            stats.update(item["stats"])
            return
        yield "token", {"text": item["text"], "token_ids": item["token_ids"],
                        "finish_reason": item["finish_reason"]}


def cleanup(coro):
    """Run a clean-up call so that a client disconnect cannot cancel it.

    `asyncio.shield` is not enough: Serve cancels every handle call made under a cancelled
    request's context, clean-up calls included. A task started in a fresh context is not the
    request's child; awaiting it shielded keeps the order (clean up, then finish) on normal exits.
    """
    task = asyncio.get_running_loop().create_task(coro, context=contextvars.Context())
    return asyncio.shield(task)


async def _abort(ing, session: SessionLog) -> None:
    try:
        await ing.client.abort(session)
    except Exception:  # best effort: the replica's TTL sweep frees it otherwise
        pass


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
        "open_s": round(time.monotonic() - session.created_at, 4),
    }


async def rag_events(ing, request):
    """Open a session, stream the source's context into it as it arrives, then answer."""
    started = time.monotonic()
    session = await ing.client.open(source_type(request.source))
    ing.sessions.add(session)
    handed_over = False
    try:
        async with session.lock:
            await ing.client.add(session, "append", ing.template.header)
            async for event in open_source(request.source, request.question, ing.actors):
                item = await context_event(ing, session, event, ing.client.add)
                if item is not None:
                    yield item
                if isinstance(event, Done):
                    break
        retrieval_s = time.monotonic() - started
        handed_over = True
        sampling = request.sampling.model_dump()
        async for name, data in answer_events(ing, session, ing.template.footer(request.question), sampling, "rag"):
            if name == "final":
                data = {**data, "retrieval_s": round(retrieval_s, 4)}
            yield name, data
    finally:
        if not handed_over:
            ing.sessions.pop(session.session_id)
            await cleanup(_abort(ing, session))


async def context_event(ing, session: SessionLog, event, add):
    """Forward one retrieval event with `add(session, mode, text) -> context tokens`; the
    (event, data) pair to send to the client, or None."""
    if isinstance(event, SourceError):
        return "source_error", {"source": event.source, "reason": event.reason}
    if isinstance(event, Done):
        return "retrieval_done", dict(event.summary)
    if not isinstance(event, (AppendChunk, ReplaceContext)):
        return None
    mode = "append" if isinstance(event, AppendChunk) else "replace"
    text = event_text(event) if mode == "append" else ing.template.header + event_text(event)
    try:
        ing.sessions.check_chunk_room(session)
        tokens = await add(session, mode, text)
    except Exception as e:
        # Over a limit: the session keeps the context it has and the answer uses that.
        if not isinstance(unwrap(e), LimitExceeded):
            raise
        return "context_skipped", {"mode": mode, "sources": citation(event), "reason": str(unwrap(e))}
    if mode == "append":
        session.sources.extend(citation(event))
    else:
        session.sources[:] = citation(event)
    return "context", {"mode": mode, "sources": citation(event), "context_tokens": tokens}
