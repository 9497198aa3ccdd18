"""The data plane on the replica: retriever stream -> prefill, and answer deltas -> coalesced items.

The replica that holds a session calls the retriever actor's streaming generator itself (Ray
cannot hand an `ObjectRefGenerator` from one actor to another, so the ingress passes the actor
handle and the call's arguments), tokenizes each piece once on a worker thread and prefills it,
and yields compact events to the ingress: context summaries (sources, token counts, no text),
source errors, skipped pieces and the retrieval summary. Chunk text makes one Ray hop: retriever
actor -> replica.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import ray

from engine.api import ContextTooLongError
from pipeline.replica.answers import AnswerPiece
from pipeline.sources import AppendChunk, Done, ReplaceContext, SourceError, citation, context_change
from stream2llm.data.traces import ContextOp

log = logging.getLogger("stream2llm.replica")

COALESCE_S = 0.005  # answer deltas produced within this window travel as one item


@dataclass(frozen=True)
class RetrieverCall:
    """A retriever actor's `stream` method and its arguments; picklable (handles are)."""

    actor: object
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


async def pull(call: RetrieverCall) -> AsyncIterator:
    """The events of a retriever actor's streaming generator (awaited refs, never `ray.get`)."""
    refs = call.actor.stream.remote(*call.args, **call.kwargs)
    exhausted = False
    try:
        try:
            async for ref in refs:
                yield await ref
        except (ray.exceptions.RayError, OSError) as e:
            # The retriever actor died or failed: a source error, not the replica's death (the
            # ingress must not take this replica for dead); the answer uses the context so far.
            log.warning("retriever stream failed: %r", e)
            yield SourceError("retriever", f"the retriever failed: {type(e).__name__}")
            yield Done({"error": type(e).__name__})
        exhausted = True
    finally:
        if not exhausted:  # the caller left or stopped early: stop the retriever working for it
            try:
                ray.cancel(refs)
            except Exception as e:
                log.debug("cancelling a retriever stream failed: %r", e)


async def settle_replacements(events: AsyncIterator, settle_s: float) -> AsyncIterator:
    """`events`, each `ReplaceContext` held until `settle_s` passes without a newer one (which
    supersedes it unseen) or another event comes (which it precedes). A progressive search refines
    its result tens of milliseconds apart: prefilling every refinement is work the next one makes
    useless, and on a CPU one such step outlasts the whole search."""
    if settle_s <= 0:
        async for event in events:
            yield event
        return
    source, held, waiting = events.__aiter__(), None, None
    try:
        while True:
            waiting = waiting or asyncio.ensure_future(source.__anext__())
            done, _ = await asyncio.wait({waiting}, timeout=settle_s if held is not None else None)
            if not done:  # quiet long enough: the held replacement stands
                event, held = held, None
                yield event
                continue
            finished, waiting = waiting, None
            try:
                event = finished.result()
            except StopAsyncIteration:
                break
            if isinstance(event, ReplaceContext):
                held = event
                continue
            if held is not None:
                earlier, held = held, None
                yield earlier
            yield event
        if held is not None:
            yield held
    finally:
        if waiting is not None:
            waiting.cancel()


class Tokenizer:
    """Tokenizes off the event loop, on one worker thread (one encode at a time: HF fast
    tokenizers must not be used from several threads at once)."""

    def __init__(self, encode):
        self._encode = encode
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenize")

    async def __call__(self, text: str) -> list[int]:
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._encode, text)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


@dataclass(frozen=True)
class ContextLimits:
    max_chunks: int
    max_context_tokens: int


def chunk_key(*parts: str) -> str:
    """A retrieved piece's identity: a hash of its content (the change's op and text, or a source
    error's source and reason). A retrieval run again after a lost replica may differ from the
    first run (a page changed, a search ranked otherwise): the ingress compares these keys to tell
    the client only what it has not seen yet, which counting events cannot do."""
    return hashlib.blake2b("\0".join(parts).encode(), digest_size=12).hexdigest()


async def pump(engine, tokenize: Tokenizer, session_id: str, header: str, events: AsyncIterator,
               limits: ContextLimits) -> AsyncIterator[tuple[str, dict]]:
    """Prefill the header, then each retrieved piece as it arrives; yield (event, data) summaries,
    each piece's with its `key` (`chunk_key`)."""
    chunks = 0
    await engine.append(session_id, token_ids=await tokenize(header))
    async for event in events:
        if isinstance(event, SourceError):
            yield "source_error", {"source": event.source, "reason": event.reason,
                                   "key": chunk_key("source_error", event.source, event.reason)}
        elif isinstance(event, Done):
            yield "retrieval_done", dict(event.summary)
            return
        elif isinstance(event, (AppendChunk, ReplaceContext)):
            item = await _prefill(engine, tokenize, session_id, header, event, chunks, limits)
            chunks += item[0] == "context"
            yield item


async def _prefill(engine, tokenize, session_id, header, event, chunks, limits) -> tuple[str, dict]:
    op, text = context_change(event, header)
    sources, key = citation(event), chunk_key(op, text)
    ids = await tokenize(text)
    kept = engine.session_stats(session_id).context_tokens if op == ContextOp.APPEND else 0
    reason = None
    if chunks >= limits.max_chunks:
        reason = f"session {session_id} already has {chunks} chunks (limit {limits.max_chunks})"
    elif kept + len(ids) > limits.max_context_tokens:
        reason = (f"context of {kept + len(ids)} tokens exceeds the limit of {limits.max_context_tokens} "
                  "tokens; the session keeps its previous context")
    if reason is None:
        try:
            tokens = await engine.change_context(session_id, op, token_ids=ids)
            return "context", {"mode": op, "sources": sources, "context_tokens": tokens, "key": key}
        except ContextTooLongError as e:  # the engine's own limit (model length)
            reason = str(e)
    return "context_skipped", {"mode": op, "sources": sources, "reason": reason, "key": key}


async def answer_pieces(deltas) -> AsyncIterator[AnswerPiece]:
    """Engine `OutputDelta`s as the `AnswerPiece`s that cross Ray."""
    async for delta in deltas:
        yield AnswerPiece(delta.text, list(delta.token_ids), delta.finish_reason)


async def coalesce(deltas: AsyncIterator, window_s: float = COALESCE_S, mergeable=None, merge=None) -> AsyncIterator:
    """Answer pieces (or what `mergeable` picks, joined by `merge`) merged so that at most one leaves
    per `window_s`; the first leaves at once; other items pass in order. A background task reads
    `deltas`, so a slow consumer never slows the engine down; errors surface in order."""
    mergeable, merge = mergeable or _mergeable, merge or _merge
    queue: asyncio.Queue = asyncio.Queue()
    end = object()

    async def feed():
        try:
            async for item in deltas:
                queue.put_nowait(item)
            queue.put_nowait(end)
        except BaseException as e:  # re-raised on the consumer's side
            queue.put_nowait(e)

    task = asyncio.get_running_loop().create_task(feed())
    last = 0.0
    try:
        while True:
            item = await queue.get()
            wait = last + window_s - time.monotonic()
            if item is not end and not isinstance(item, BaseException) and wait > 0:
                await asyncio.sleep(wait)
            batch = [item]
            while not queue.empty() and mergeable(batch[-1]):
                batch.append(queue.get_nowait())
            merged = [b for b in batch if mergeable(b)]
            if merged:
                last = time.monotonic()
                yield merge(merged)
            tail = batch[-1]
            if tail is end:
                return
            if isinstance(tail, BaseException):
                raise tail
            if not mergeable(tail):
                yield tail
    finally:
        task.cancel()


def _mergeable(item) -> bool:
    return isinstance(item, AnswerPiece)


def _merge(items: list[AnswerPiece]) -> AnswerPiece:
    if len(items) == 1:
        return items[0]
    return AnswerPiece("".join(i.text for i in items), [t for i in items for t in i.token_ids],
                       items[-1].finish_reason)
