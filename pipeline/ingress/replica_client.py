"""The ingress side of a session: admission, routed calls with affinity, and recovery.

All calls go through the engine deployment's Serve handle (the `AffinityRouter` honours
`route_to`). When a session's replica is gone, the session is re-admitted on another replica and
its context log replayed there; the final event then says `recovered`.
"""

from __future__ import annotations

import logging
from collections import Counter

from engine.api import SessionNotFoundError
from pipeline.control.central_client import CentralClient
from pipeline.ingress.cleanup import cleanup
from pipeline.errors import (AnswerDiverged, AnswerNotReproducible, NeverFits, SessionGone, admission_error,
                             is_replica_gone, unwrap)
from pipeline.replica.answers import AnswerPiece
from pipeline.sessions.log import SessionLog, new_session_id
from scheduler.token_estimate import PromptTokenEstimate
from stream2llm.data.traces import ContextOp

log = logging.getLogger("stream2llm.client")

MAX_RECOVERIES = 2
CHARS_PER_TOKEN = 3  # the fit check's estimate of a prompt's tokens: high for most text (a tokenizer decides)


class EngineClient:
    def __init__(self, handle, scheduler, admission_timeout_s: float, context_limit: int,
                 admission_slots: int = 0, max_model_len: int | None = None, sessions=None):
        """`sessions`: the session store (`pipeline.sessions.store.SessionStore`) whose sessions move
        under its move mark (a scale-down may be moving one: `pipeline.replica.drain`)."""
        self._handle = handle
        self._sessions = sessions
        self._scheduler = scheduler            # the raw handle: replica_died
        # admissions and releases, batched per process; plain admissions from slots when granted
        self._central = CentralClient(scheduler, slots=admission_slots)
        self._admission_timeout_s = admission_timeout_s
        self._context_limit = context_limit  # tokens a session may hold (AppConfig.context_limit)
        self._max_model_len = max_model_len  # prompt + answer of one request at most
        self._prompt_estimates: dict[str, PromptTokenEstimate] = {}  # per OpenAI route: a lease's prompt

    @property
    def central(self) -> CentralClient:
        """This process's batching client of the central scheduler (shared by every route)."""
        return self._central

    async def admit(self, source_type: str, exclude: list[str] | None = None,
                    session_id: str | None = None) -> tuple[str, str]:
        """Place a session; with `exclude` it is a recovery (served first, never placed back there)."""
        session_id = session_id or new_session_id()
        ask = {"recovery": True} if exclude else {}
        decision = await self._central.admit(session_id, source_type, self._admission_timeout_s,
                                             exclude or [], **ask)
        if (error := admission_error(decision)) is not None:
            raise error
        return session_id, decision["replica_id"]

    async def admit_request(self, request_id: str, text: str, max_tokens: int, token_ids: int = 0,
                            answers: int = 1, fit_tokens: int | None = None, kind: str = "completion") -> str:
        """Admit a one-shot request whose prompt is `text` (its prompt, or its messages' contents) plus
        `token_ids` given as ids, with `answers` answers of up to `max_tokens` each (OpenAI's `n`);
        returns the replica. `NeverFits` (400) at once when prompt plus one answer exceed the model's
        length: the text's tokens are estimated from its characters, and counted by a replica's
        tokenizer only when the estimate says it may not fit (an estimate alone must not refuse a
        prompt that fits). The lease holds the prompt (the tokenizer's count when it ran, else
        `prompt_estimate(kind)`'s, calibrated by what replicas counted) and every answer. `fit_tokens`:
        the answer tokens the fit is checked with, when they differ from the lease's (no max_tokens
        given: vLLM answers in what the prompt leaves, so one token must fit)."""
        fit = max_tokens if fit_tokens is None else fit_tokens
        prompt = None
        limit = self._max_model_len
        if limit is not None and len(text) // CHARS_PER_TOKEN + token_ids + fit > limit:
            prompt = (len(await self._handle.tokenize.remote(text)) if text else 0) + token_ids
            if prompt + fit > limit:
                raise NeverFits(f"the prompt ({prompt} tokens) plus {fit} answer tokens "
                                f"exceed the model's length of {limit} tokens")
        if prompt is None:  # the lease's size: the estimate calibrated by the replicas' counts
            prompt = self.prompt_estimate(kind).tokens(len(text)) + token_ids
        tokens = prompt + answers * max_tokens
        decision = await self._central.admit_request(request_id, tokens, self._admission_timeout_s)
        if (error := admission_error(decision)) is not None:
            raise error
        return decision["replica_id"]

    def prompt_estimate(self, kind: str) -> PromptTokenEstimate:
        """The estimate of a one-shot prompt's tokens from its text for `kind` (an OpenAI route);
        `observe` it with what the replica counted."""
        estimate = self._prompt_estimates.get(kind)
        if estimate is None:
            estimate = self._prompt_estimates[kind] = PromptTokenEstimate(CHARS_PER_TOKEN)
        return estimate

    async def open(self, source_type: str, owner: str | None = None) -> SessionLog:
        """Admit and open a session; `owner`: the ingress actor that alone drives it (its replica
        aborts the session once that actor is gone), None for sessions any ingress may serve."""
        session_id, replica_id = await self.admit(source_type)
        session = SessionLog(session_id, source_type, replica_id, owner=owner)
        await self._open_on(session, replica_id)
        return session

    async def _open_on(self, session: SessionLog, replica_id: str) -> None:
        """Open `session` on the replica the central scheduler placed it on. It lives where the open
        landed: a router that cannot use the placed replica (one it has not listed within
        `pipeline.control.router.OPEN_WAIT_S`, or one that died) sends the open to another, and every later call follows."""
        session.replica_id = replica_id  # from now on an abort (a cut-off caller) goes to this replica
        try:
            info = await self._handle.open_session.remote(session.session_id, session.source_type, session.owner,
                                                          route_to=replica_id)
        except BaseException:
            # A caller cut off (client disconnect) does not undo an open that reached the replica:
            # close it there too, or it holds its slot and KV until the replica's idle TTL.
            cleanup(self.abort_quietly(session))
            raise
        if info["replica_id"] != replica_id:  # routed elsewhere: its holder's next report adopts it
            log.warning("session %s opened on %s, not on %s", session.session_id, info["replica_id"], replica_id)
            self._central.release(session.session_id)
        session.replica_id, session.node_id = info["replica_id"], info["node_id"]

    async def add(self, session: SessionLog, op: ContextOp, text: str, seq: int | None = None) -> int:
        """Append or replace context; the op is logged only once the replica accepted it. `seq`: the
        client's sequence number, which the replica checks too (`EngineReplica.change_context`)."""
        tokens = await self._call(session, "change_context", op, text, self._context_limit, seq)
        session.ops.append((op, text))
        session.context_tokens = tokens
        session.touch()
        return tokens

    async def _call(self, session: SessionLog, method: str, *args):
        for attempt in range(MAX_RECOVERIES + 1):
            try:
                fn = getattr(self._handle, method)
                return await fn.remote(session.session_id, *args, route_to=session.replica_id)
            except Exception as e:
                await self._recover_or_raise(session, e, attempt)
        raise AssertionError("unreachable")

    async def _recover_or_raise(self, session: SessionLog, error: Exception, attempt: int) -> None:
        """After a failed call: re-raise it unless the session's replica was lost and a recovery
        is left; else recover the session elsewhere, for the caller to try again."""
        if not _retryable(error, attempt):
            raise error
        await self.recover(session, dead=is_replica_gone(error))

    async def recover(self, session: SessionLog, dead: bool) -> None:
        """Re-admit the session elsewhere and rebuild its context there: the client's logged ops,
        or the retriever call run again (the ingress keeps no retrieved text). A session of the
        store that a stopping replica moved meanwhile is not rebuilt: the call goes where it is now."""
        old = session.replica_id
        if dead:
            self._central.replica_died(old)
            await self._scheduler.replica_died.remote(old)
        marked = False
        if self._sessions is not None and session.owner is None:  # a session of the store
            marked = await self._sessions.begin_move(session.session_id, old) is not None
            if not marked and await self._moved_meanwhile(session, old):
                return
        replayed = False
        try:
            await self._replay(session, old, dead)
            replayed = True
        finally:
            if marked:
                await self._sessions.end_move(session if replayed else None, session.session_id)
        self._scheduler.note_moves.remote({"replayed": 1})  # counted cluster-wide (no reply awaited)

    async def _moved_meanwhile(self, session: SessionLog, old: str) -> bool:
        """Whether another mover (a stopping replica) moved the session off `old`: then `session`
        points where it is now. Read once that move ended (the store's read waits for it)."""
        try:
            now, _ = await self._sessions.get(session.session_id, for_change=False)
        except SessionGone:  # finished (this is its answer's call) or gone: replay as before
            return False
        if now.replica_id == old:
            return False
        log.info("session %s was moved from %s to %s meanwhile", session.session_id, old, now.replica_id)
        session.replica_id, session.node_id, session.context_tokens = now.replica_id, now.node_id, now.context_tokens
        return True

    async def _replay(self, session: SessionLog, old: str, dead: bool) -> None:
        log.warning("session %s lost its replica %s (dead=%s): replaying %d ops%s", session.session_id, old,
                    dead, len(session.ops), " and its retrieval" if session.retrieval_done else "")
        _, replica_id = await self.admit(session.source_type, exclude=[old], session_id=session.session_id)
        await self._open_on(session, replica_id)
        if session.retrieval_done:  # run again, into the new replica (the client has its events)
            session.restart_retrieval()
            async for name, data in self._context_stream(session, session.retrieval):
                data.pop("key", None)
                session.context_pos = data.pop("pos", 0)
                session.note_retrieved(name, data)
        for op, text in session.replay_ops():  # to where the open landed, not where it was placed
            session.context_tokens = await self._handle.change_context.remote(session.session_id, op, text,
                                                                              route_to=session.replica_id)
        session.recovered += 1

    def _context_stream(self, session: SessionLog, call):
        return self._handle.options(stream=True).stream_context.remote(
            session.session_id, call, route_to=session.replica_id)

    async def take_over(self, session: SessionLog) -> dict:
        """Drive `session` from this ingress (its first one died): the replica's `take_over`; a replica
        gone too is `SessionGone` (404: nothing holds the session)."""
        try:
            return await self._handle.take_over.remote(session.session_id, session.owner, route_to=session.replica_id)
        except Exception as e:
            if is_replica_gone(e):
                raise SessionGone(f"session {session.session_id!r} was lost with its replica "
                                  f"{session.replica_id}, and the ingress driving it died: ask again") from None
            raise unwrap(e) from None

    async def stream_context(self, session: SessionLog, call, after: int = 0):
        """The replica pulls the retriever's stream into the session; yields its summaries and keeps
        the session's citations. A lost replica: the retrieval runs again on another one, which
        may differ from the first run; events are matched by identity (the replica's content hash
        of each piece, `pipeline.replica.context.chunk_key`, counted with repeats), so the caller
        gets every piece of the new run it has not had, whatever its position, and nothing twice.
        The citations become the new run's: what the answer's replica holds. `after`: the client
        has the replica's first `after` summaries already (a take-over): they are noted, not yielded.
        `session.context_pos` follows the position in the replica's log of the last summary read."""
        session.retrieval = call
        sent: Counter = Counter()
        for attempt in range(MAX_RECOVERIES + 1):
            run: Counter = Counter()
            session.restart_retrieval()
            try:
                async for name, data in self._context_stream(session, call):
                    key = (name, data.pop("key", None))
                    run[key] += 1
                    pos = session.context_pos = data.pop("pos", 0)
                    session.note_retrieved(name, data)
                    if attempt == 0 and 0 < pos <= after:  # the client had it from the ingress that died
                        sent[key] += 1
                    elif run[key] > sent[key]:
                        sent[key] += 1
                        yield name, data
                session.retrieval_done = True
                return
            except Exception as e:
                await self._recover_or_raise(session, e, attempt)

    async def finish(self, session: SessionLog, question: str, sampling: dict, or_resume: bool = False):
        """Yield `AnswerPiece`s then the `AnswerEnd`. A replica lost mid-answer is recovered and the
        answer regenerated when it is reproducible (greedy or seeded); the new replica checks its
        answer token by token against the tokens already sent before it sends the rest, and a
        difference ends the answer with `AnswerDiverged` (its context was rebuilt otherwise)."""
        sent: list[int] = []
        for attempt in range(MAX_RECOVERIES + 1):
            stream = self._handle.options(stream=True).finish.remote(
                session.session_id, question, sampling, expect=list(sent) if sent else None,
                or_resume=or_resume and not sent, route_to=session.replica_id)
            try:
                async for item in stream:
                    if isinstance(item, AnswerPiece):
                        sent.extend(item.token_ids)
                    yield item
                return
            except Exception as e:
                if isinstance(unwrap(e), AnswerDiverged):
                    raise unwrap(e) from None
                if sent and _retryable(e, attempt) and not reproducible(sampling):
                    raise AnswerNotReproducible(
                        f"replica {session.replica_id} was lost after {len(sent)} answer tokens and the sampling "
                        "is neither greedy nor seeded: ask again") from None
                await self._recover_or_raise(session, e, attempt)

    def resume(self, session: SessionLog, after_tokens: int):
        """The rest of an answer held by `session.replica_id` (after a lost connection)."""
        return self._handle.options(stream=True).resume.remote(
            session.session_id, after_tokens, route_to=session.replica_id)

    async def tokenize(self, session: SessionLog, text: str) -> list[int]:
        return await self._handle.tokenize.remote(text, route_to=session.replica_id)

    def generate(self, session: SessionLog, token_ids: list[int], sampling: dict):
        """One-shot generation on the session's replica, salted with its id (no KV reuse)."""
        return self._handle.options(stream=True).generate.remote(
            None, sampling, token_ids=token_ids, cache_salt=session.session_id, route_to=session.replica_id)

    async def abort(self, session: SessionLog) -> bool:
        try:
            return await self._handle.abort.remote(session.session_id, route_to=session.replica_id)
        except Exception as e:
            if not _needs_recovery(e):
                raise
            return False
        finally:
            self._central.release(session.session_id)

    async def abort_quietly(self, session: SessionLog) -> None:
        """`abort`, best effort (clean-up paths): a failure is logged, the replica's idle TTL frees it."""
        try:
            await self.abort(session)
        except Exception as e:
            log.warning("abort of session %s on %s failed (its replica's idle TTL frees it): %r",
                        session.session_id, session.replica_id, e)

    async def detach_quietly(self, session: SessionLog) -> None:
        """The session's retrieval lost its reader: its replica keeps it for a take-over for the resume
        grace, then aborts it (`EngineReplica.detach`); best effort, as `abort_quietly`."""
        try:
            await self._handle.detach.remote(session.session_id, route_to=session.replica_id)
        except Exception as e:
            log.warning("detach of session %s on %s failed (its replica's owner check frees it): %r",
                        session.session_id, session.replica_id, e)

    def release(self, session: SessionLog, context_tokens: int | None) -> None:
        """Post the session's release to the central scheduler (returns at once)."""
        self._central.release(session.session_id, context_tokens)


def reproducible(sampling: dict) -> bool:
    """Another replica generates the same answer: greedy decoding, or a fixed seed."""
    return (sampling.get("temperature") or 0.0) == 0.0 or sampling.get("seed") is not None


def _retryable(error: BaseException, attempt: int) -> bool:
    return attempt < MAX_RECOVERIES and _needs_recovery(error)


def _needs_recovery(error: BaseException) -> bool:
    return is_replica_gone(error) or isinstance(unwrap(error), SessionNotFoundError)

