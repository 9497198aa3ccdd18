"""The one retriever interface: an async stream of context events.

Every retriever (crawler, vector search, trace replay) is an ``AsyncIterator[ContextEvent]``:
- ``AppendChunk``: add one chunk to the end of the context (append mode, crawler).
- ``ReplaceContext``: the whole context is now this ordered list of chunks (update mode, vector).
- ``SourceError``: one source failed (a page, a search step); the stream goes on.
- ``Done``: the stream is over; ``summary`` holds counters and timings.
Events are plain frozen dataclasses so they pickle cheaply through Ray object streams.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Union


@dataclass(frozen=True)
class Chunk:
    """A piece of context. ``source_id`` names the document (crawler: page id; vector: chunk id)."""

    text: str
    source_id: str
    url_or_doc_id: str
    title: str
    num_tokens: int = 0


@dataclass(frozen=True)
class AppendChunk:
    text: str
    source_id: str
    url_or_doc_id: str
    title: str
    num_tokens: int = 0
    # time.monotonic() when retrieval of this piece began (None when unknown); used to record traces
    started_at: float | None = None

    @property
    def chunk(self) -> Chunk:
        return Chunk(self.text, self.source_id, self.url_or_doc_id, self.title, self.num_tokens)

    @classmethod
    def of(cls, chunk: Chunk, started_at: float | None = None) -> AppendChunk:
        return cls(chunk.text, chunk.source_id, chunk.url_or_doc_id, chunk.title, chunk.num_tokens,
                   started_at)


@dataclass(frozen=True)
class ReplaceContext:
    chunks: tuple[Chunk, ...]

    @property
    def source_ids(self) -> tuple[str, ...]:
        return tuple(c.source_id for c in self.chunks)

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)


@dataclass(frozen=True)
class SourceError:
    source: str  # a URL, "search", or a retriever name
    reason: str


@dataclass(frozen=True)
class Done:
    summary: dict[str, Any] = field(default_factory=dict)


ContextEvent = Union[AppendChunk, ReplaceContext, SourceError, Done]
ContextStream = AsyncIterator[ContextEvent]


async def collect(stream: ContextStream) -> list[ContextEvent]:
    """Drain a stream into a list (tests, benchmarks)."""
    return [event async for event in stream]
