"""The engine replica deployment: one `StreamingEngine` per Serve replica.

Every method takes an optional `route_to` keyword that the replica ignores: the request router
(`pipeline.control.router.AffinityRouter`) reads it to send a session's calls to the replica that holds it.
The replica reports its KV use and open sessions to the central scheduler at a steady interval and
aborts sessions idle longer than the TTL, so an abandoned stream cannot hold KV forever.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import asdict

import ray
from ray import serve

from engine.api import SamplingConfig, SessionNotFoundError
from pipeline.replica.answers import AnswerEnd, AnswerLogs
from pipeline.replica.context_log import ContextLogs, outside_the_request
from pipeline.control.central import get_or_create_scheduler
from pipeline.control.central_client import drain_replica
from pipeline.config import AppConfig
from pipeline.errors import ContextLimitExceeded, SessionConflict, SessionGone, context_limit_errors
from pipeline.replica.context import (ContextLimits, RetrieverCall, Tokenizer, answer_pieces, coalesce, pull,
                                      pump, settle_replacements)
from pipeline.control.liveness import serve_actor_alive
from pipeline.replica.session_owners import IDLE_BEFORE_CHECK_S, SessionOwners
from pipeline.replica.handover import SessionHandover
from pipeline.replica.upkeep import ReplicaUpkeep
from stream2llm.data.traces import ContextOp

log = logging.getLogger("stream2llm.replica")


async def build_engine(config: AppConfig):
    from engine.vllm_engine import create_engine  # imported here: only replicas need vLLM

    return await create_engine(config.engine_config())


class EngineReplica(ReplicaUpkeep, SessionHandover):
    async def __init__(self, config: dict):
        self._config = AppConfig.model_validate(config)
        self._engine = await build_engine(self._config)
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        self.node_id = ray.get_runtime_context().get_node_id()
        self._touched: dict[str, float] = {}   # open session -> last activity (monotonic)
        self._source: dict[str, str] = {}      # open session -> source type
        self._owners = SessionOwners(serve_actor_alive)
        self._busy: set[str] = set()
        self._applied_seq: dict[str, int] = {}  # open session -> client seq of the change applied last
        self._arriving: dict[str, asyncio.Event] = {}  # sessions being adopted -> set once their context is in
        self._last_stats: dict = {}
        self._pressure: dict = {}
        self._tokenize = Tokenizer(self._engine.tokenize)
        limits = self._config.limits
        self._answers = AnswerLogs(grace_s=limits.resume_grace_s, keep_s=limits.session_ttl_s)
        self._contexts = ContextLogs(grace_s=limits.resume_grace_s, task_context=outside_the_request)
        self._detached: dict[str, float] = {}  # session -> when it is aborted unless taken over
        # an orphan is a session whose driving ingress is gone and whose client did not take it over
        # (reconnect with Last-Event-ID) within the resume grace
        self._orphan_after_s = max(IDLE_BEFORE_CHECK_S, limits.resume_grace_s)
        self._header: str | None = None
        self._scheduler = get_or_create_scheduler(self._config)
        self._reporter = asyncio.get_running_loop().create_task(self._report_loop())

    # ---- sessions ------------------------------------------------------------------------
    async def open_session(self, session_id: str, source_type: str = "client", owner: str | None = None,
                           route_to=None) -> dict:
        """`owner`: the ingress actor driving a one-request session (`pipeline.replica.session_owners`)."""
        await self._engine.open_session(session_id)
        self._touched[session_id] = time.monotonic()
        self._source[session_id] = source_type
        self._owners.add(session_id, owner)
        return {"session_id": session_id, "replica_id": self.replica_id, "node_id": self.node_id}

    async def change_context(self, session_id: str, op: ContextOp, text: str, limit: int | None = None,
                             seq: int | None = None, route_to=None) -> int:
        """Append or replace (`op`); `limit` caps the session's context tokens. `seq`: the client's
        sequence number; the change applied last here is not applied twice (its ingress died before
        recording it and a retry brought it again), an older one is refused."""
        await self._arrived(session_id)
        return await self._change(session_id, op, text, limit, seq)

    async def _change(self, session_id: str, op: ContextOp, text: str, limit: int | None, seq: int | None) -> int:
        self._known(session_id)
        last = self._applied_seq.get(session_id, -1)
        if seq is not None and seq <= last:
            if seq < last:
                raise SessionConflict(f"change seq {seq} of session {session_id} is older than seq {last}, applied")
            return self._engine.session_stats(session_id).context_tokens
        self._busy.add(session_id)
        try:
            ids = await self._tokenize(text)  # once, on a worker thread
            if limit is not None:
                kept = self._engine.session_stats(session_id).context_tokens if op == ContextOp.APPEND else 0
                if kept + len(ids) > limit:
                    raise ContextLimitExceeded(f"context of {kept + len(ids)} tokens exceeds the limit of "
                                               f"{limit} tokens; the session keeps its previous context")
            with context_limit_errors():
                tokens = await self._engine.change_context(session_id, op, token_ids=ids)
            if seq is not None:
                self._applied_seq[session_id] = max(seq, self._applied_seq.get(session_id, -1))
            return tokens
        finally:
            self._busy.discard(session_id)
            self._touch(session_id)

    async def stream_context(self, session_id: str, call: RetrieverCall, after: int = 0, route_to=None):
        """Pull a retriever actor's stream into the session (prefilling each piece as it comes, a
        replacement once it settles), in a task of this replica that outlives the caller
        (`pipeline.replica.context_log`); yield the (event, data) summaries after the first `after`,
        each with its log position `pos`: context, context_skipped, source_error, retrieval_done.
        A second call (another ingress took the session over) tails the same retrieval."""
        await self._arrived(session_id)
        self._known(session_id)
        log = self._contexts.start_or_get(session_id, lambda: self._pull_context(session_id, call))
        async for item in log.tail(after):
            yield item

    async def _pull_context(self, session_id: str, call: RetrieverCall):
        self._busy.add(session_id)
        limits = ContextLimits(self._config.limits.max_chunks_per_session, self._config.context_limit)
        try:
            events = settle_replacements(pull(call), self._config.retrievers.replace_settle_s)
            async for item in pump(self._engine, self._tokenize, session_id, await self._prompt_header(),
                                   events, limits):
                yield item
        finally:
            self._busy.discard(session_id)
            self._touch(session_id)

    async def finish(self, session_id: str, question: str, sampling: dict | None = None,
                     expect: list[int] | None = None, or_resume: bool = False, route_to=None):
        """Start the answer (in a task of this replica) and stream it: coalesced `AnswerPiece`s,
        then one `AnswerEnd`; every item carries `tokens` (the answer's tokens so far). `expect`: the
        tokens a client already has (this is a regeneration after a lost replica), checked one by
        one before the rest follows (`AnswerLog.tail`). A second finish is a `SessionConflict` (409),
        unless `or_resume` (an ingress that took the session over: the answer from its start)."""
        if or_resume and (started := self._answers.get(session_id)) is not None:
            async for item in started.tail(0):
                yield item
            return
        if self._answers.get(session_id) is not None:
            raise SessionConflict(f"session {session_id} was already finished; reconnect with "
                                  "Last-Event-ID to get the rest of its answer")
        await self._arrived(session_id)
        self._known(session_id)
        self._busy.add(session_id)
        log = self._answers.start(session_id, self._produce(session_id, question, sampling))
        async for item in log.tail(expect=expect):
            yield item

    async def resume(self, session_id: str, after_tokens: int = 0, route_to=None):
        """The rest of an answer this replica generated (or is generating), after `after_tokens`."""
        log = self._answers.get(session_id)
        if log is None:
            raise SessionGone(f"no answer of session {session_id!r} on this replica (it expired, or the "
                              "replica that held it was lost): ask again")
        async for item in log.tail(after_tokens):
            yield item

    async def _produce(self, session_id: str, question: str, sampling: dict | None):
        done = False
        try:
            with context_limit_errors():
                deltas = self._engine.finish(session_id, question, sampling=SamplingConfig(**(sampling or {})))
                async for item in coalesce(answer_pieces(deltas)):
                    yield item
            done = True
            yield AnswerEnd(self._session_stats(session_id))
        finally:
            self._busy.discard(session_id)
            self._forget(session_id)
            if not done:
                await self._abort_quietly(session_id)

    async def generate(self, prompt: str | None, sampling: dict | None = None, token_ids: list[int] | None = None,
                       cache_salt: str | None = None, route_to=None):
        """One-shot generation (the non-streaming baseline of /v1/rag); cancellation aborts it."""
        from engine.api import SessionStats

        stats = SessionStats(session_id=cache_salt or uuid.uuid4().hex)  # names the engine request: unique
        deltas = self._engine.generate(prompt, token_ids=token_ids, sampling=SamplingConfig(**(sampling or {})),
                                       stats=stats, cache_salt=cache_salt)
        with context_limit_errors():
            async for item in answer_pieces(deltas):
                yield item
        yield AnswerEnd({**asdict(stats), "ttft_s": stats.ttft_s, "replica_id": self.replica_id})

    async def openai(self, route: str, body: dict, route_to=None):
        """An OpenAI route ("chat" or "completion") served by vLLM's own serving layer
        (`engine.vllm_openai`): an `OpenAIReply`, a stream's SSE lines (coalesced over 5 ms), then
        the request's `OpenAITimings`. Cancellation (the client left) aborts the request."""
        async for item in coalesce(self._engine.openai(route, body), mergeable=_is_text, merge="".join):
            yield item

    async def abort(self, session_id: str, route_to=None) -> bool:
        """Abort (its answer too) and free KV; False when the session was not open here."""
        answering = self._answers.cancel(session_id)
        self._forget(session_id)
        if answering:
            return True  # the answer task aborts the engine session as it ends
        return await self._abort_quietly(session_id)

    async def _abort_quietly(self, session_id: str) -> bool:
        try:
            await self._engine.abort(session_id)
            return True
        except SessionNotFoundError:
            return False

    def _known(self, session_id: str) -> None:
        if session_id not in self._touched:
            raise SessionNotFoundError(f"session {session_id!r} is not open on replica {self.replica_id}")

    def _touch(self, session_id: str) -> None:
        if session_id in self._touched:
            self._touched[session_id] = time.monotonic()

    def _forget(self, session_id: str) -> None:
        self._touched.pop(session_id, None)
        self._source.pop(session_id, None)
        self._applied_seq.pop(session_id, None)
        self._owners.forget(session_id)
        self._contexts.end(session_id)
        self._detached.pop(session_id, None)

    def _session_stats(self, session_id: str) -> dict:
        s = self._engine.session_stats(session_id)
        return {**asdict(s), "ttft_s": s.ttft_s, "replica_id": self.replica_id, "node_id": self.node_id}

    # ---- introspection -----------------------------------------------------------------------
    async def tokenize(self, text: str, route_to=None) -> list[int]:
        return self._engine.tokenize(text)

    async def prompt_template(self, route_to=None) -> dict:
        from engine.prompt import RagPrompt

        return RagPrompt(self._engine.tokenizer).template_parts()

    async def _prompt_header(self) -> str:
        if self._header is None:
            self._header = (await self.prompt_template())["header"]
        return self._header

    async def info(self, route_to=None) -> dict:
        return {"replica_id": self.replica_id, "node_id": self.node_id,
                "max_model_len": self._engine.max_model_len, "sessions": sorted(self._touched),
                "stats": await self._fresh_stats()}

    async def _fresh_stats(self) -> dict:
        s = await self._engine.stats()
        self._last_stats = {**asdict(s), "kv_blocks_free": s.kv_blocks_free}
        return self._last_stats

    async def __del__(self):
        if getattr(self, "_scheduler", None) is not None:  # scale-down: no new placements here
            await drain_replica(self._scheduler, self.replica_id)
        reporter = getattr(self, "_reporter", None)
        if reporter is not None:
            reporter.cancel()
        if getattr(self, "_scheduler", None) is not None:
            await self._move_sessions_out()
        if getattr(self, "_tokenize", None) is not None:
            self._tokenize.close()
        engine = getattr(self, "_engine", None)
        if engine is not None:
            await engine.shutdown()



def _is_text(item) -> bool:
    return isinstance(item, str)

