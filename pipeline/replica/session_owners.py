"""The ingress replica that drives a one-request session (`/v1/rag`), and whether it still lives.

A `/v1/rag` session is driven from start to answer by the one ingress replica that took the
request, or by the one its client's reconnect reached after that one died (a take-over: the replica
records the new owner); streaming-input sessions, by contrast, live in the session store and any
ingress serves them. When the driving ingress dies before the answer starts and no client takes the
session over, nobody will finish or abort it: without an owner check its replica would hold its KV
until the idle TTL. The
replica records the owner at open and, for sessions idle a while, asks whether the owner's actor
still exists (one lookup per owner per `recheck_s`, whatever the number of its sessions).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable

IDLE_BEFORE_CHECK_S = 2.0  # a session idle less than this is mid-flow: its owner is not asked about
RECHECK_S = 5.0            # an owner found alive is trusted this long


class SessionOwners:
    def __init__(self, is_alive: Callable[[str], Awaitable[bool]], recheck_s: float = RECHECK_S,
                 clock: Callable[[], float] = time.monotonic):
        self._is_alive = is_alive
        self._recheck_s = recheck_s
        self._clock = clock
        self._owner: dict[str, str] = {}          # session -> owner's actor name
        self._alive_at: dict[str, float] = {}     # owner -> when it was last found alive

    def add(self, session_id: str, owner: str | None) -> None:
        if owner:
            self._owner[session_id] = owner

    def owned(self, session_id: str) -> bool:
        """Whether an ingress drives the session (a one-request session, not one the store holds)."""
        return session_id in self._owner

    def forget(self, session_id: str) -> None:
        self._owner.pop(session_id, None)

    async def orphans(self, idle_sessions: Iterable[str]) -> list[str]:
        """The sessions among `idle_sessions` whose owner no longer exists."""
        now = self._clock()
        owned = [(sid, self._owner[sid]) for sid in idle_sessions if sid in self._owner]
        dead = set()
        for owner in {o for _, o in owned}:
            if now - self._alive_at.get(owner, -self._recheck_s) < self._recheck_s:
                continue
            if await self._is_alive(owner):
                self._alive_at[owner] = now
            else:
                dead.add(owner)
                self._alive_at.pop(owner, None)
        return [sid for sid, owner in owned if owner in dead]
