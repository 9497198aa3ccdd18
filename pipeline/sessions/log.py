"""A session as the ingress sees it during one request (kept between requests by
`pipeline.sessions.store`).

The log records every client append/replace in order, so that a session whose replica dies can be
replayed on another replica; a retriever source's context is rebuilt by running its call again (its
citations are then those of the new run: what the new replica holds).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field

from stream2llm.data.traces import ContextOp


@dataclass
class SessionLog:
    session_id: str
    source_type: str
    replica_id: str
    node_id: str = ""
    ops: list[tuple[ContextOp, str]] = field(default_factory=list)
    retrieval: object | None = None     # a RetrieverCall the replica ran (no text kept here)
    retrieval_done: bool = False
    retrieved_chunks: int = 0           # pieces the replica prefilled from `retrieval`
    context_pos: int = 0                # position in the replica's context log of the last summary read
    last_seq: int = -1                  # highest client sequence number applied (idempotent appends)
    sources: list[dict] = field(default_factory=list)         # citations, in arrival order
    context_tokens: int = 0
    recovered: int = 0
    owner: str | None = None            # the ingress driving a one-request session (None: store-held)
    created_at: float = field(default_factory=time.time)   # wall clock: records move between hosts
    touched_at: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)

    @property
    def chunks(self) -> int:
        return len(self.ops) + self.retrieved_chunks

    def touch(self) -> None:
        self.touched_at = time.monotonic()

    def cite(self, op: ContextOp, sources: list[dict]) -> None:
        """Citations after a change: an append adds its sources, a replace is the new set."""
        if op == ContextOp.APPEND:
            self.sources.extend(sources)
        else:
            self.sources[:] = sources

    def note_retrieved(self, name: str, data: dict) -> None:
        """A summary of a piece the replica prefilled from `retrieval` (citations, counts)."""
        if name == "context":
            self.cite(data["mode"], data["sources"])
            self.retrieved_chunks += 1
            self.context_tokens = data["context_tokens"]

    def restart_retrieval(self) -> None:
        """The retrieval runs again on a new replica: its citations are those of the new run."""
        self.sources.clear()
        self.retrieved_chunks = 0

    def replay_ops(self) -> list[tuple[ContextOp, str]]:
        """The smallest equivalent history: everything after the last replace."""
        last_replace = max((i for i, (op, _) in enumerate(self.ops) if op == ContextOp.REPLACE), default=0)
        return self.ops[last_replace:]

    def summary(self) -> dict:
        return {"session_id": self.session_id, "replica_id": self.replica_id, "node_id": self.node_id,
                "source_type": self.source_type, "chunks": self.chunks,
                "context_tokens": self.context_tokens, "recovered": self.recovered}


def new_session_id() -> str:
    return uuid.uuid4().hex
