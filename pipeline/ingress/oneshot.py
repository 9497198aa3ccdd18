"""The non-streaming baseline of /v1/rag (`"prompt_mode": "oneshot"`): what a plain vLLM server does.

Retrieval runs exactly as in streaming mode (same sources, same events to the client, same limits),
but nothing reaches the engine until retrieval is done: then the whole prompt is generated in one
request on the admitted replica. The prompt is the same token sequence a streamed session ends
with (each piece tokenized on its own, as appends are), so greedy answers of both modes agree. It
is salted with the session id so it never reuses KV cached by another request (a streamed run of
the same question included): its TTFT is the full prefill, as for a fresh question.
"""

from __future__ import annotations

import time

from pipeline.errors import LimitExceeded
from pipeline.ingress.flows import FlowContext, context_items, final_event, token_events
from pipeline.sessions.log import SessionLog
from pipeline.sources import open_source
from stream2llm.data.traces import ContextOp, PromptMode


class BufferedPrompt:
    """The pieces of a one-shot prompt as token ids, kept in the ingress until retrieval ends."""

    def __init__(self, ctx: FlowContext):
        self._ctx = ctx
        self._pieces: list[list[int]] = []

    async def add(self, session: SessionLog, op: ContextOp, text: str) -> int:
        """Same limit as a streamed session: the context it would hold after this piece."""
        self._ctx.metrics.ingress_chunk_bytes.inc(len(text.encode()))  # the baseline buffers text here
        ids = await self._ctx.client.tokenize(session, text)
        total = len(ids) + (session.context_tokens if op == ContextOp.APPEND else 0)
        limit = self._ctx.context_limit
        if total > limit:
            raise LimitExceeded(f"context of {total} tokens exceeds the limit of {limit} tokens; "
                                "the session keeps its previous context")
        self._pieces = self._pieces + [ids] if op == ContextOp.APPEND else [ids]
        session.ops.append((op, text))
        session.context_tokens = total
        return total

    def token_ids(self, footer: list[int]) -> list[int]:
        return [t for piece in self._pieces for t in piece] + footer


async def oneshot_rag_events(ctx: FlowContext, request, source_type: str):
    started = time.monotonic()
    session_id, replica_id = await ctx.client.admit(source_type)
    session = SessionLog(session_id, source_type, replica_id)
    prompt = BufferedPrompt(ctx)
    finished = False
    try:
        await prompt.add(session, ContextOp.APPEND, ctx.template.header)
        async for item in context_items(ctx, session, open_source(request.source, request.question, ctx.actors),
                                        prompt.add):
            yield item
        retrieval_s = time.monotonic() - started
        footer = await ctx.client.tokenize(session, ctx.template.footer(request.question))
        stats: dict = {}
        answer = ctx.client.generate(session, prompt.token_ids(footer), request.sampling.model_dump())
        async for event in token_events(answer, stats):
            yield event
        finished = True
        ctx.metrics.observe_final("rag_oneshot", stats)
        yield "final", {**final_event(session, {**stats, "tokens_prefilled_before_finish": 0}),
                        "retrieval_s": round(retrieval_s, 4), "prompt_mode": PromptMode.ONESHOT}
    finally:
        if not finished:
            ctx.metrics.aborted.labels("cut_short").inc()
        # Cancelling the generate stream aborts its engine request; only the admission is left.
        ctx.client.release(session, session.context_tokens if finished else None)
