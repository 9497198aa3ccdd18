"""One vLLM streaming-input request: the KV of a session lives here while it is open.

vLLM 0.32 appends each `StreamingInput` to the request and keeps the KV between them. Every
intermediate input is prefill-only (`max_tokens=1`); vLLM still samples one token per input and
discards it from the sequence before the next input, so we drop exactly one token per
intermediate input from the output stream. Tokens after those belong to the answer.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

from vllm import SamplingParams
from vllm.engine.protocol import StreamingInput
from vllm.inputs import TokensPrompt
from vllm.sampling_params import RequestOutputKind

from engine.vllm_views import DEFERRED_TURN, OPENED_ARG, PARTIAL_TURN_ARG, RECOMPUTED_KEY, SUPERSEDES_ARG

# The mark tells the scheduler plug-in that this turn is not the question (`engine.vllm_views`).
_PREFILL_ONLY = SamplingParams(max_tokens=1, temperature=0.0, output_kind=RequestOutputKind.DELTA,
                               extra_args={PARTIAL_TURN_ARG: True})
_STREAM_END = None
ABORTED = "abort"  # finish reason of an answer cut short by close()


class LiveRequest:
    """Feeds inputs to `AsyncLLM.generate` and sorts what comes back into throwaway and answer."""

    def __init__(self, llm, on_prefilled=None, replaces: "LiveRequest | None" = None,
                 opened_at: float | None = None):
        """For a request that `replaces` an earlier one of the same session: `opened_at` (wall
        clock, as vLLM stamps arrivals) is when the session opened, so it keeps its place in line,
        and the scheduler ranks the replaced request last from then on."""
        self.request_id = f"s2l-{uuid.uuid4().hex[:12]}"
        self._replacing = None if opened_at is None else {
            OPENED_ARG: opened_at, SUPERSEDES_ARG: replaces.request_id if replaces else None}
        self._sent_first = False
        self.started = asyncio.Event()  # the engine answered once: the first input was prefilled
        self._llm = llm
        self._inputs: asyncio.Queue = asyncio.Queue()
        self._turn_lengths: list[int] = []  # context length after each intermediate input
        self._context_len = 0
        self._tokens_seen = 0
        self._final_submitted = False
        self._answer: asyncio.Queue = asyncio.Queue()
        self._on_prefilled = on_prefilled
        self.prefilled_tokens = 0
        self.cached_tokens: int | None = None
        self.first_answer_at: float | None = None
        self._prefilled = asyncio.Event()
        self._prefilled.set()
        # Tokens of this request's first input that an earlier request of the session had already
        # computed (the common prefix of a replace): what the prefix cache misses of them is recomputed.
        self.reusable_tokens = 0
        self.engine_recomputed = 0  # recomputed after evictions/preemptions, reported by the scheduler
        self._task = asyncio.create_task(self._read())

    def add_context(self, token_ids: list[int]) -> None:
        self._context_len += len(token_ids)
        self._turn_lengths.append(self._context_len)
        self._prefilled.clear()
        self._put(token_ids, _PREFILL_ONLY)

    def add_final(self, token_ids: list[int], params: SamplingParams) -> None:
        self._final_submitted = True
        self._put(token_ids, params)
        self._inputs.put_nowait(_STREAM_END)

    def _put(self, token_ids: list[int], params: SamplingParams) -> None:
        if self._replacing is not None and not self._sent_first:
            params = params.clone()  # first input of a replacement: carry the session's opening
            params.extra_args = {**(params.extra_args or {}), **self._replacing}
        self._sent_first = True
        # The engine mutates the first prompt's list in place: always hand over a copy.
        self._inputs.put_nowait(StreamingInput(TokensPrompt(prompt_token_ids=list(token_ids)), params))

    @property
    def recomputed_tokens(self) -> int:
        """Tokens computed again: the part of the reusable prefix the prefix cache could not supply,
        plus what the scheduler recomputed after evicting or preempting this request. New
        context is never counted here."""
        missed = max(0, self.reusable_tokens - self.cached_tokens) if self.cached_tokens is not None else 0
        return missed + self.engine_recomputed

    @property
    def all_prefilled(self) -> bool:
        return self.prefilled_tokens >= self._context_len

    async def wait_prefilled(self) -> None:
        """Until every context chunk given so far was taken in: prefilled, or (a stream degraded
        to one-shot under memory pressure) accepted to be prefilled with the question."""
        waiter = asyncio.ensure_future(self._prefilled.wait())
        try:
            done, _ = await asyncio.wait({waiter, self._task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()  # also when the caller is cancelled: no orphaned waiter task
        if waiter not in done:
            raise RuntimeError("the engine request ended before its context was prefilled")

    async def answer(self) -> AsyncIterator[tuple[list[int], bool, str | None]]:
        """(new answer token ids, finished, finish reason) as they come; raises engine errors."""
        while True:
            item = await self._answer.get()
            if isinstance(item, BaseException):
                raise item
            yield item
            if item[1]:
                return

    async def wait_started(self) -> None:
        """Until the engine has answered this request once, or the request has ended."""
        waiter = asyncio.ensure_future(self.started.wait())
        try:
            await asyncio.wait({waiter, self._task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()

    async def close_after(self, replacement) -> None:
        """Close this request once `replacement` (or None) has run once; cancelling closes at once."""
        try:
            if replacement is not None:
                await replacement.wait_started()
        finally:
            await self.close()

    async def close(self) -> None:
        """Abort in vLLM (cancelling generate() aborts the request) and wait until it is gone.
        Whoever waits for the answer gets an `ABORTED` end instead of waiting forever."""
        if not self._task.done():
            self._task.cancel()
        try:
            await self._task
        except (asyncio.CancelledError, Exception):
            pass
        self._answer.put_nowait(([], True, ABORTED))

    async def _input_stream(self):
        while (item := await self._inputs.get()) is not _STREAM_END:
            yield item

    async def _read(self) -> None:
        try:
            async for output in self._llm.generate(self._input_stream(), _PREFILL_ONLY, self.request_id):
                self._consume(output)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # surfaced to whoever waits for the answer
            self._answer.put_nowait(error)

    def _consume(self, output) -> None:
        self.started.set()
        if self.cached_tokens is None and output.num_cached_tokens is not None:
            self.cached_tokens = output.num_cached_tokens
        if output.finished and output.kv_transfer_params:
            self.engine_recomputed = output.kv_transfer_params.get(RECOMPUTED_KEY, 0)
        completion = output.outputs[0]
        answer_ids = []
        deferred = completion.stop_reason == DEFERRED_TURN  # accepted, to be prefilled with the question
        for token in completion.token_ids:
            if self._tokens_seen < len(self._turn_lengths):
                turn_end = self._turn_lengths[self._tokens_seen]
                if not deferred:
                    self.prefilled_tokens = turn_end
                    if self._on_prefilled:
                        self._on_prefilled(turn_end)
                if turn_end >= self._context_len:
                    self._prefilled.set()
            elif self._final_submitted:
                answer_ids.append(token)
            self._tokens_seen += 1
        if answer_ids and self.first_answer_at is None:
            self.first_answer_at = time.monotonic()
        if answer_ids or output.finished:
            self._answer.put_nowait((answer_ids, output.finished, completion.finish_reason))
