"""How a session changes hands on the engine replica: adopted from a replica that is stopping
(`pipeline.replica.drain`), taken over by another ingress after its first one died (its client
reconnected with Last-Event-ID), detached when its reader left, and moved out when this replica
stops. A mixin of `EngineReplica`, whose state it reads."""

from __future__ import annotations

import asyncio
import time

from pipeline.errors import SessionConflict, SessionGone
from pipeline.replica.drain import move_out
from stream2llm.data.traces import ContextOp


class SessionHandover:
    async def adopt(self, session_id: str, source_type: str, ops: list, last_seq: int = -1, route_to=None) -> dict:
        """Take over a session from a replica that is stopping (`pipeline.replica.drain`): open it and
        prefill its logged context (`ops`, in order); its other calls here wait until that is done."""
        if session_id in self._touched:
            raise SessionConflict(f"session {session_id} is already open on replica {self.replica_id}")
        arrived = self._arriving[session_id] = asyncio.Event()
        try:
            info = await self.open_session(session_id, source_type)
            tokens = 0
            for op, text in ops:
                tokens = await self._change(session_id, ContextOp(op), text, None, None)
            self._applied_seq[session_id] = last_seq
        except BaseException:
            await self.abort(session_id)
            raise
        finally:
            del self._arriving[session_id]
            arrived.set()
        return {**info, "context_tokens": tokens}

    async def _arrived(self, session_id: str) -> None:
        """A session being adopted here (`adopt`) is used only once its context is in."""
        arriving = self._arriving.get(session_id)
        if arriving is not None:
            await arriving.wait()

    async def take_over(self, session_id: str, owner: str | None, route_to=None) -> dict:
        """Another ingress drives the session from now on (its client reconnected after the first
        one died); whether its answer has started here. `SessionGone` when this replica holds
        neither the session nor its answer."""
        answering = self._answers.get(session_id) is not None
        if session_id not in self._touched and not answering:
            raise SessionGone(f"session {session_id!r} is not open on replica {self.replica_id} (its replica "
                              "was lost as well as the ingress driving it): ask again")
        self._owners.forget(session_id)
        self._owners.add(session_id, owner)
        self._detached.pop(session_id, None)
        self._touch(session_id)
        return {"answering": answering, "retrieving": self._contexts.get(session_id) is not None}

    async def detach(self, session_id: str, route_to=None) -> bool:
        """The reader of the session's retrieval left (its client, or its ingress going down): the
        session is kept for `limits.resume_grace_s` for a take-over (`take_over`), then aborted, as an
        answer nobody reads is. False when the session is not open here."""
        if session_id not in self._touched:
            return False
        self._detached[session_id] = time.monotonic() + self._config.limits.resume_grace_s
        return True

    async def _move_sessions_out(self) -> None:
        """Move the store-held sessions open here to other replicas before stopping."""
        held = [sid for sid in self._touched if not self._owners.owned(sid)]
        if held:
            await move_out(self.replica_id, held, self._config, self._scheduler)
