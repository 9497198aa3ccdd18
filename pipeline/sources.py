"""Adapter from a /v1/rag `Source` to a stream of retriever context events.

The only place the pipeline touches `retrievers/`: every source becomes an async iterator of
`retrievers.events` (AppendChunk / ReplaceContext / SourceError / Done). Inline documents and
offline-corpus doc ids are built here; crawl, search, vector and trace go through the retriever
Ray actors (streaming generators) in `retrievers.ray_actors` (see `pipeline.ingress.retriever_actors`).
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator

from engine.prompt import piece_text
from pipeline.errors import BadRequest
from pipeline.schemas import Source
from retrievers.events import AppendChunk, Done, ReplaceContext, SourceError
from stream2llm.data.traces import ContextOp

SOURCE_TYPES = {"crawl": "crawler", "search": "crawler", "vector": "vector", "trace": "trace",
                "documents": "client", "corpus": "client"}


def source_type(source: Source) -> str:
    """The demand class the central scheduler learns per (crawler / vector / trace / client)."""
    return SOURCE_TYPES[source.type]


async def inline_documents(texts: list[str]) -> AsyncIterator:
    for i, text in enumerate(texts):
        yield AppendChunk(text=text, source_id=f"doc-{i}", url_or_doc_id=f"inline:{i}", title=f"document {i}")
    yield Done({"chunks": len(texts)})


@functools.lru_cache(maxsize=1)
def _corpus() -> dict:
    from stream2llm.data.corpus import documents_by_id

    return documents_by_id()


async def corpus_documents(doc_ids: list[str]) -> AsyncIterator:
    docs = _corpus()
    missing = [d for d in doc_ids if d not in docs]
    if missing:
        raise BadRequest(f"unknown corpus doc ids: {missing[:5]}")
    for doc_id in doc_ids:
        doc = docs[doc_id]
        yield AppendChunk(text=doc.text, source_id=doc_id, url_or_doc_id=doc_id, title=doc.title)
    yield Done({"chunks": len(doc_ids)})


def open_source(source: Source, question: str, actors) -> AsyncIterator:
    """The event stream of a source; `actors` resolves the retriever-actor kinds."""
    if source.type == "documents":
        return inline_documents(source.documents)
    if source.type == "corpus":
        return corpus_documents(source.doc_ids)
    return actors.stream(source, question)


def event_text(event) -> str:
    """Context text of an append, or the whole new context of a replace."""
    if isinstance(event, AppendChunk):
        return piece_text(event.source_id, event.title, event.text)
    return "".join(piece_text(c.source_id, c.title, c.text) for c in event.chunks)


def context_change(event: AppendChunk | ReplaceContext, header: str) -> tuple[ContextOp, str]:
    """The change a retrieved piece makes to its session: the piece appended, or a whole new context
    that starts with the prompt header (so a replace keeps the header's KV)."""
    if isinstance(event, AppendChunk):
        return ContextOp.APPEND, event_text(event)
    return ContextOp.REPLACE, header + event_text(event)


def citation(event) -> list[dict]:
    chunks = [event.chunk] if isinstance(event, AppendChunk) else list(event.chunks)
    return [{"source_id": c.source_id, "url_or_doc_id": c.url_or_doc_id, "title": c.title} for c in chunks]


__all__ = ["AppendChunk", "ReplaceContext", "SourceError", "Done", "open_source", "event_text",
           "citation", "source_type"]
