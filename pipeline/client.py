"""The ingress side of a session: admission, routed calls with affinity, and recovery.

All calls go through the engine deployment's Serve handle (the `AffinityRouter` honours
`route_to`). When a session's replica is gone, the session is re-admitted on another replica and
its context log replayed there; the final event then says `recovered`.
"""

from __future__ import annotations

import logging

from engine.api import SessionNotFoundError
from pipeline.errors import AdmissionRejected, is_replica_gone, unwrap
from pipeline.sessions import SessionLog, new_session_id

log = logging.getLogger("stream2llm.client")

MAX_RECOVERIES = 2


class EngineClient:
    def __init__(self, handle, scheduler, limits):
        self._handle = handle
        self._scheduler = scheduler
        self._limits = limits

    async def admit(self, source_type: str, exclude: list[str] | None = None,
                    session_id: str | None = None) -> tuple[str, str]:
        session_id = session_id or new_session_id()
        decision = await self._scheduler.admit.remote(
            session_id, source_type, self._limits.admission_timeout_s, exclude or [])
        if "rejected" in decision:
            raise AdmissionRejected(decision["rejected"], decision["retry_after_s"])
        return session_id, decision["replica_id"]

    async def open(self, source_type: str) -> SessionLog:
        session_id, replica_id = await self.admit(source_type)
        try:
            info = await self._handle.open_session.remote(session_id, source_type, route_to=replica_id)
        except BaseException:
            await self._scheduler.release.remote(session_id)
            raise
        if info["replica_id"] != replica_id:  # routed elsewhere: its holder's next report adopts it
            log.warning("session %s opened on %s, not on %s", session_id, info["replica_id"], replica_id)
            await self._scheduler.release.remote(session_id)
        return SessionLog(session_id, source_type, info["replica_id"], info["node_id"])

    async def add(self, session: SessionLog, kind: str, text: str) -> int:
        """Append or replace context; the op is logged only once the replica accepted it."""
        method = "append" if kind == "append" else "update"
        tokens = await self._call(session, method, text, self._limits.max_context_tokens)
        session.ops.append((kind, text))
        session.context_tokens = tokens
        session.touch()
        return tokens

    async def _call(self, session: SessionLog, method: str, *args):
        for attempt in range(MAX_RECOVERIES + 1):
            try:
                fn = getattr(self._handle, method)
                return await fn.remote(session.session_id, *args, route_to=session.replica_id)
            except Exception as e:
                if attempt == MAX_RECOVERIES or not _needs_recovery(e):
                    raise
                await self.recover(session, dead=is_replica_gone(e))
        raise AssertionError("unreachable")

    async def recover(self, session: SessionLog, dead: bool) -> None:
        """Re-admit the session elsewhere and replay its context log there."""
        old = session.replica_id
        log.warning("session %s lost its replica %s (dead=%s): replaying %d ops",
                    session.session_id, old, dead, len(session.ops))
        if dead:
            await self._scheduler.replica_died.remote(old)
        await self._scheduler.release.remote(session.session_id)
        _, replica_id = await self.admit(session.source_type, exclude=[old], session_id=session.session_id)
        info = await self._handle.open_session.remote(session.session_id, session.source_type,
                                                      route_to=replica_id)
        session.replica_id, session.node_id = info["replica_id"], info["node_id"]
        for kind, text in session.replay_ops():
            method = "append" if kind == "append" else "update"
            fn = getattr(self._handle, method)
            session.context_tokens = await fn.remote(session.session_id, text, route_to=replica_id)
        session.recovered += 1

    async def finish(self, session: SessionLog, question: str, sampling: dict):
        """Yield answer deltas then {"stats": ...}; a replica lost mid-answer is recovered and
        the answer resumes after the tokens already sent (greedy decoding is deterministic)."""
        sent = 0
        for attempt in range(MAX_RECOVERIES + 1):
            stream = self._handle.options(stream=True).finish.remote(
                session.session_id, question, sampling, route_to=session.replica_id)
            seen = 0
            try:
                async for item in stream:
                    if "stats" in item:
                        yield item
                        return
                    ids = item["token_ids"]
                    seen += len(ids)
                    if seen > sent:
                        skip = len(ids) - (seen - sent)
                        yield {**item, "token_ids": ids[skip:], "text": item["text"] if skip == 0 else ""}
                        sent = seen
                return
            except Exception as e:
                if attempt == MAX_RECOVERIES or not _needs_recovery(e):
                    raise
                await self.recover(session, dead=is_replica_gone(e))

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
            await self._scheduler.release.remote(session.session_id)

    async def release(self, session: SessionLog, context_tokens: int | None) -> None:
        await self._scheduler.release.remote(session.session_id, context_tokens)


def _needs_recovery(error: BaseException) -> bool:
    return is_replica_gone(error) or isinstance(unwrap(error), SessionNotFoundError)

