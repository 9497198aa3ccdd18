"""Session context logs, kept in the ingress (outside the replicas), and their lifetime.

A log records every append/replace in order, so that a session whose replica dies can be replayed
on another replica. Logs idle past the TTL are dropped (and their replica session aborted).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field

from pipeline.errors import LimitExceeded, SessionConflict, SessionGone


@dataclass
class SessionLog:
    session_id: str
    source_type: str
    replica_id: str
    node_id: str = ""
    ops: list[tuple[str, str]] = field(default_factory=list)   # ("append" | "replace", text)
    retrieval: object | None = None     # a RetrieverCall the replica ran (no text kept here)
    retrieval_done: bool = False
    retrieved_chunks: int = 0           # pieces the replica prefilled from `retrieval`
    last_seq: int = -1                  # highest client sequence number applied (idempotent appends)
    sources: list[dict] = field(default_factory=list)         # citations, in arrival order
    context_tokens: int = 0
    recovered: int = 0
    created_at: float = field(default_factory=time.monotonic)
    touched_at: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)

    @property
    def chunks(self) -> int:
        return len(self.ops) + self.retrieved_chunks

    def touch(self) -> None:
        self.touched_at = time.monotonic()

    def replay_ops(self) -> list[tuple[str, str]]:
        """The smallest equivalent history: everything after the last replace."""
        last_replace = max((i for i, (kind, _) in enumerate(self.ops) if kind == "replace"), default=0)
        return self.ops[last_replace:]

    def summary(self) -> dict:
        return {"session_id": self.session_id, "replica_id": self.replica_id, "node_id": self.node_id,
                "source_type": self.source_type, "chunks": self.chunks,
                "context_tokens": self.context_tokens, "recovered": self.recovered}


def new_session_id() -> str:
    return uuid.uuid4().hex


class SessionTable:
    def __init__(self, ttl_s: float, max_chunks: int):
        self.ttl_s = ttl_s
        self.max_chunks = max_chunks
        self._logs: dict[str, SessionLog] = {}
        self._finished: dict[str, float] = {}   # finished session -> when (a second finish is a 409)

    def mark_finished(self, session_id: str) -> None:
        self._logs.pop(session_id, None)
        self._finished[session_id] = time.monotonic()

    def check_not_finished(self, session_id: str) -> None:
        if session_id in self._finished:
            raise SessionConflict(f"session {session_id} was already finished; reconnect with "
                                  "Last-Event-ID to get the rest of its answer")

    def add(self, log: SessionLog) -> None:
        self._logs[log.session_id] = log

    def get(self, session_id: str) -> SessionLog:
        log = self._logs.get(session_id)
        if log is None:
            raise SessionGone(f"session {session_id!r} is unknown, finished, deleted or expired")
        return log

    def pop(self, session_id: str) -> SessionLog | None:
        return self._logs.pop(session_id, None)

    def check_chunk_room(self, log: SessionLog) -> None:
        if log.chunks >= self.max_chunks:
            raise LimitExceeded(f"session {log.session_id} already has {log.chunks} chunks "
                                f"(limit {self.max_chunks})")

    def expired(self, now: float | None = None) -> list[SessionLog]:
        """Logs idle past the TTL and not in use; removed from the table."""
        now = time.monotonic() if now is None else now
        out = [log for log in self._logs.values()
               if now - log.touched_at > self.ttl_s and not log.lock.locked()]
        for log in out:
            del self._logs[log.session_id]
        for sid in [s for s, at in self._finished.items() if now - at > self.ttl_s]:
            del self._finished[sid]
        return out

    def __len__(self) -> int:
        return len(self._logs)

    def values(self) -> list[SessionLog]:
        return list(self._logs.values())
