"""Record our own retriever runs as QueryTraces (and CSV files in the paper's formats)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

from .events import AppendChunk, ContextStream, ReplaceContext
from stream2llm.data.traces import ContextOp, QueryTrace, TraceEvent, write_crawler_csv, write_vector_csv

SEARCH_SOURCE_ID = "search"


class TraceRecorder:
    """Wrap a stream: ``async for e in rec.wrap(stream)``; then ``rec.trace()`` (None if nothing
    was emitted). Errors and Done are not part of the paper's traces and are not recorded."""

    def __init__(self, query_id: str, shape: str, query: str, question_tokens: int,
                 output_tokens: int = 128, clock: Callable[[], float] = time.monotonic):
        if shape not in ("crawler", "vector"):
            raise ValueError(f"shape must be 'crawler' or 'vector', got {shape!r}")
        self.query_id, self.shape, self.query = query_id, shape, query
        self.question_tokens, self.output_tokens = question_tokens, output_tokens
        self._clock = clock
        self._events: list[TraceEvent] = []
        self._doc_tokens: dict[str, int] = {}
        self._start: float | None = None

    async def wrap(self, stream: ContextStream) -> ContextStream:
        self._start = self._clock()
        async for event in stream:
            self._note(event)
            yield event

    def _note(self, event) -> None:
        now = self._clock() - self._start
        previous_end = self._events[-1].end_s if self._events else 0.0
        if isinstance(event, AppendChunk):
            began = event.started_at - self._start if event.started_at is not None else previous_end
            kind = "tavily_search" if event.source_id == SEARCH_SOURCE_ID else "page_scrape"
            self._events.append(TraceEvent(max(0.0, began), now, ContextOp.APPEND, event.num_tokens, event.text,
                                           (event.source_id,), kind))
        elif isinstance(event, ReplaceContext):
            for chunk in event.chunks:
                self._doc_tokens[chunk.source_id] = chunk.num_tokens
            self._events.append(TraceEvent(previous_end, now, ContextOp.REPLACE,
                                           event.num_tokens + self.question_tokens,
                                           doc_ids=event.source_ids, source="vector"))

    def trace(self) -> QueryTrace | None:
        if not self._events:
            return None
        return QueryTrace(self.query_id, self.shape, self.query, tuple(self._events),
                          self.question_tokens, self.output_tokens, dict(self._doc_tokens))


def write_traces(traces: Sequence[QueryTrace], path: Path) -> Path:
    """One CSV for many queries of one shape, in the paper's format for that shape."""
    shapes = {t.shape for t in traces}
    if len(shapes) != 1:
        raise ValueError(f"write_traces needs traces of one shape, got {sorted(shapes)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    (write_crawler_csv if shapes == {"crawler"} else write_vector_csv)(list(traces), path)
    return path
