"""`StreamingEngine` on vLLM's AsyncLLM (V1). All vLLM contact of the project lives in engine/.

Append uses vLLM's own streaming-input path (`LiveRequest`). Update (replace the whole context)
keeps the KV of the longest common prefix: when the new context merely extends the old one it is
an append; otherwise a new request is started with the new context and the old one is closed only
after the new one has run once, so vLLM's prefix cache hands the new request the old one's KV
blocks of the common prefix (all full blocks of it; the partial block at the divergence point is
recomputed). The new request keeps the session's opening time, hence its place in line.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Sequence

from engine.api import (ContextTooLongError, EngineStats, InvalidInputError, OutputDelta,
                        SamplingConfig, SessionNotFoundError, SessionStateError,
                        SessionStats, StreamingEngine)
from engine.config import EngineConfig
from engine.session import (AnswerStream, IncrementalDetokenizer, Session, SessionState, check_text,
                            check_token_ids, longest_common_prefix)

_CLOSED_STATS_KEPT = 1024


async def create_engine(config: EngineConfig) -> "VLLMStreamingEngine":
    """Build an AsyncLLM for `config` and wrap it. Prepares offline models on first use."""
    from vllm.v1.engine.async_llm import AsyncLLM

    from engine.engine_args import build_vllm_config
    from engine.vllm_stats import KvSnapshot, snapshot_logger_factory

    from scheduler.policies import make_policy

    make_policy(config.policy)  # fail fast, in this process, on an unknown policy name
    vllm_config = build_vllm_config(config)
    snapshot = KvSnapshot()
    llm = AsyncLLM.from_vllm_config(vllm_config, stat_loggers=[snapshot_logger_factory(snapshot)])
    tokenizer = llm.get_tokenizer() if hasattr(llm, "get_tokenizer") else llm.tokenizer
    if hasattr(tokenizer, "__await__"):
        tokenizer = await tokenizer
    return VLLMStreamingEngine(llm, config, tokenizer, snapshot)


class VLLMStreamingEngine(StreamingEngine):
    def __init__(self, llm, config: EngineConfig, tokenizer, snapshot):
        self._llm = llm
        self._config = config
        self._tokenizer = tokenizer
        self._snapshot = snapshot
        self._sessions: dict[str, Session] = {}
        self._closed_stats: dict[str, SessionStats] = {}
        self._vocab_size = llm.model_config.get_vocab_size()
        self._openai: asyncio.Future | None = None

    # ---- inputs -------------------------------------------------------------------------
    def tokenize(self, text: str) -> list[int]:
        return self._tokenizer.encode(check_text(text), add_special_tokens=False)

    @property
    def tokenizer(self):
        return self._tokenizer

    @property
    def max_model_len(self) -> int:
        return self._config.max_model_len

    @property
    def context_limit(self) -> int:
        """Most context tokens a session may hold: room is kept for the question and answer."""
        return self._config.max_model_len - self._config.answer_budget_tokens

    def _ids(self, text: str | bytes | None, token_ids: Sequence[int] | None) -> list[int]:
        if (text is None) == (token_ids is None):
            raise InvalidInputError("give exactly one of text or token_ids")
        if token_ids is not None:
            return check_token_ids(token_ids, self._vocab_size)
        return self.tokenize(check_text(text))

    # ---- session lifecycle --------------------------------------------------------------
    async def open_session(self, session_id: str | None = None) -> str:
        session_id = session_id or uuid.uuid4().hex
        if session_id in self._sessions:
            raise SessionStateError(f"session {session_id!r} already exists")
        self._sessions[session_id] = Session(session_id, SessionStats(session_id))
        return session_id

    def _session(self, session_id: str, *, for_input: bool = True) -> Session:
        session = self._sessions.get(session_id)
        if session is None or session.state is SessionState.CLOSED:  # closed: gone once its KV is freed
            raise SessionNotFoundError(f"no open session {session_id!r}")
        if for_input and session.state is not SessionState.OPEN:
            raise SessionStateError(f"session {session_id!r} is {session.state.value}: no more input")
        return session

    def _check_fits(self, session: Session, num_tokens: int) -> None:
        if num_tokens > self.context_limit:
            raise ContextTooLongError(num_tokens, self.context_limit, session_closed=False)

    def _start_request(self, session: Session, reusable: int | None = None, replaces=None):
        """A new engine request for `session`; for one that `replaces` an earlier request (`None`
        there when the session had none), `reusable` says how many leading tokens of its input that
        one had computed; it keeps the session's place in line."""
        from engine.live_request import LiveRequest

        def on_prefilled(tokens: int) -> None:
            if session.state is SessionState.OPEN or session.stats.finish_at is None:
                session.stats.tokens_prefilled_before_finish = tokens

        session.request = LiveRequest(self._llm, on_prefilled, replaces,
                                      None if reusable is None else session.opened_at)
        session.request.reusable_tokens = reusable or 0
        return session.request

    def _note_chunk(self, session: Session) -> None:
        stats, now = session.stats, time.monotonic()
        stats.first_chunk_at, stats.last_chunk_at = stats.first_chunk_at or now, now
        stats.context_tokens = len(session.context)

    async def append(self, session_id: str, text=None, token_ids=None) -> int:
        session = self._session(session_id)
        ids = self._ids(text, token_ids)
        self._check_fits(session, len(session.context) + len(ids))
        if ids:
            request = session.request or self._start_request(session)
            request.add_context(ids)
            session.context.extend(ids)
        session.stats.chunks += 1
        self._note_chunk(session)
        return len(session.context)

    async def replace(self, session_id: str, text=None, token_ids=None) -> int:
        session = self._session(session_id)
        ids = self._ids(text, token_ids)
        self._check_fits(session, len(ids))
        keep = longest_common_prefix(session.context, ids)
        session.stats.replaces += 1
        if keep == len(session.context):  # a pure extension invalidates nothing
            session.stats.chunks -= 1
            return await self.append(session_id, token_ids=ids[keep:])
        # No await from here on: an abort cannot interleave with the swap of requests.
        session.stats.tokens_invalidated += len(session.context) - keep
        old, session.request, session.context = session.request, None, []
        if ids:
            self._start_request(session, min(keep, old.prefilled_tokens) if old else 0, old).add_context(ids)
            session.context = ids
        self._retire(session, old)
        self._note_chunk(session)
        return len(session.context)

    def _retire(self, session: Session, old) -> None:
        """Close `old` once the session's new request has run once (at once if there is none):
        while `old` lives its KV stays, shared by the new request's common prefix through the prefix
        cache. Under pressure the policy may evict it first: `tokens_recomputed` says how much."""
        if old is None:
            return
        session.stats.tokens_recomputed += old.recomputed_tokens
        task = asyncio.create_task(old.close_after(session.request))
        session.retiring[old] = task
        task.add_done_callback(lambda _: session.retiring.pop(old, None))

    def finish(self, session_id: str, question=None, token_ids=None,
               sampling: SamplingConfig | None = None) -> AsyncIterator[OutputDelta]:
        session = self._session(session_id)
        ids = self._ids(question, token_ids)
        if not ids:
            raise InvalidInputError("the question is empty")
        sampling = sampling or SamplingConfig()
        total = len(session.context) + len(ids) + sampling.max_tokens
        if total > self._config.max_model_len:
            raise ContextTooLongError(total, self._config.max_model_len, session_closed=False)
        session.state = SessionState.FINISHING
        request = session.request
        if request is not None and sampling.seed is not None:
            # vLLM seeds a request's sampler when the request starts, from its first input's
            # parameters: a seed on a later turn would be ignored. Honour it with a fresh request
            # for context + question; the live one is kept until then, so its KV is shared.
            old, session.request = request, None
            request = self._start_request(session, reusable=len(session.context), replaces=old)
            ids = session.context + ids
            session.context = []
            self._retire(session, old)
        request = request or self._start_request(session)
        session.context.extend(ids)
        session.stats.finish_at = time.monotonic()
        request.add_final(ids, _sampling_params(sampling))
        return AnswerStream(self._stream_answer(session, request), lambda: self._close(session))

    async def _stream_answer(self, session: Session, request) -> AsyncIterator[OutputDelta]:
        detok = IncrementalDetokenizer(self._tokenizer)
        try:
            async for token_ids, finished, reason in request.answer():
                if token_ids and session.stats.first_token_at is None:
                    session.stats.first_token_at = request.first_answer_at or time.monotonic()
                session.stats.output_tokens += len(token_ids)
                text = detok.push(token_ids, final=finished)
                yield OutputDelta(text, tuple(token_ids), finished, reason)
        finally:
            await self._close(session)

    async def abort(self, session_id: str) -> None:
        await self._close(self._session(session_id, for_input=False))

    async def _close(self, session: Session) -> None:
        if session.state is SessionState.CLOSED:
            return
        session.state = SessionState.CLOSED
        request, session.request = session.request, None
        for old, task in list(session.retiring.items()):
            task.cancel()  # a task cancelled before it ran never reaches its `finally`: close here
            await old.close()
        if request is not None:
            session.stats.tokens_recomputed += request.recomputed_tokens
            await request.close()
        session.stats.done_at = time.monotonic()
        self._sessions.pop(session.session_id, None)
        self._closed_stats[session.session_id] = session.stats
        while len(self._closed_stats) > _CLOSED_STATS_KEPT:
            self._closed_stats.pop(next(iter(self._closed_stats)))

    async def wait_prefilled(self, session_id: str) -> int:
        session = self._session(session_id, for_input=False)
        if session.request is not None:
            await session.request.wait_prefilled()
        return len(session.context)

    # ---- baseline and introspection -----------------------------------------------------
    async def generate(self, prompt=None, token_ids=None, sampling: SamplingConfig | None = None,
                       stats: SessionStats | None = None, cache_salt: str | None = None,
                       ) -> AsyncIterator[OutputDelta]:
        from vllm.inputs import TokensPrompt

        ids = self._ids(prompt, token_ids)
        sampling = sampling or SamplingConfig()
        if len(ids) + sampling.max_tokens > self._config.max_model_len:
            raise ContextTooLongError(len(ids) + sampling.max_tokens, self._config.max_model_len, True)
        stats = stats or SessionStats(uuid.uuid4().hex)
        stats.context_tokens, stats.finish_at = len(ids), time.monotonic()
        detok = IncrementalDetokenizer(self._tokenizer)
        request_id = f"gen-{stats.session_id}"
        prompt_input = TokensPrompt(prompt_token_ids=list(ids))
        if cache_salt is not None:
            prompt_input["cache_salt"] = cache_salt
        async for output in self._llm.generate(prompt_input, _sampling_params(sampling), request_id):
            completion = output.outputs[0]
            if completion.token_ids and stats.first_token_at is None:
                stats.first_token_at = time.monotonic()
            stats.output_tokens += len(completion.token_ids)
            text = detok.push(completion.token_ids, final=output.finished)
            yield OutputDelta(text, tuple(completion.token_ids), output.finished, completion.finish_reason)
        stats.done_at = time.monotonic()

    async def openai(self, route: str, body: dict):
        from engine.vllm_openai import OpenAIFrontend

        if self._openai is None:  # built on first use: engines without OpenAI traffic skip it
            self._openai = asyncio.ensure_future(OpenAIFrontend.create(self._llm, self._config))
        async for item in (await self._openai).serve(route, body):
            yield item

    async def drop_device_prefix_cache(self) -> None:
        """Drop the device's prefix cache but keep KV offloaded to host memory (swap calibration)."""
        await self._llm.reset_prefix_cache(reset_connector=False)

    def session_stats(self, session_id: str) -> SessionStats:
        session = self._sessions.get(session_id)
        if session is not None:
            return session.stats
        if session_id in self._closed_stats:
            return self._closed_stats[session_id]
        raise SessionNotFoundError(f"unknown session {session_id!r}")

    async def stats(self) -> EngineStats:
        cache = self._llm.vllm_config.cache_config
        total = cache.num_gpu_blocks or 0
        sessions = list(self._sessions.values())
        decoding = sum(s.state is SessionState.FINISHING for s in sessions)
        idle = sum(s.state is SessionState.OPEN and (s.request is None or s.request.all_prefilled)
                   for s in sessions)
        return EngineStats(
            kv_blocks_total=total, kv_blocks_used=round(self._snapshot.usage * total),
            block_size=cache.block_size, sessions_active=len(sessions), sessions_idle=idle,
            sessions_decoding=decoding,
            preemptions=self._snapshot.preemptions,
            extra={"engine_steps": self._snapshot.steps, "running": self._snapshot.num_running,
                   "waiting": self._snapshot.num_waiting, "kv_usage_peak": self._snapshot.peak_usage,
                   # requests vLLM's front end still tracks: a leaked one holds KV and a slot
                   "requests_in_flight": self._llm.output_processor.get_num_unfinished_requests()},
        )

    async def shutdown(self) -> None:
        for session in list(self._sessions.values()):
            await self._close(session)
        self._llm.shutdown()


def _sampling_params(sampling: SamplingConfig):
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(max_tokens=sampling.max_tokens, temperature=sampling.temperature,
                          top_p=sampling.top_p, seed=sampling.seed, output_kind=RequestOutputKind.DELTA)
