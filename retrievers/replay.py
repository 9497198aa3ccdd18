"""Replay recorded or synthetic QueryTraces as context streams, on the trace's clock.

Each event is emitted at ``start + end_s * multiplier`` (the paper's delay multiplier stretches
retrieval to create memory pressure). Chunks without text (synthetic traces) get filler text of
about ``num_tokens`` words drawn from a seeded vocabulary, different per query and chunk, so the
engine's prefix cache does not see identical filler across queries.
"""

from __future__ import annotations

import asyncio
import random
import time
import zlib
from collections.abc import Callable
from dataclasses import replace

from stream2llm.data.corpus import documents_by_id
from .events import AppendChunk, Chunk, ContextStream, Done, ReplaceContext
from stream2llm.data.traces import QueryTrace

TextFor = Callable[[str, int], str]  # (doc id, tokens wanted) -> text
_VOCAB = ("time year people way day man thing woman life child world school state family student "
          "group country problem hand part place case week company system program question work "
          "government number night point home water room mother area money story fact month lot "
          "right study book eye job word business issue side kind head house service friend father "
          "power hour game line end member law car city community name president team minute idea "
          "kid body information back parent face others level office door health person art war "
          "history party result change morning reason research girl guy moment air teacher force "
          "education river mountain island capital border trade harbor valley coast forest").split()


def filler_text(key: str, num_tokens: int) -> str:
    """About ``num_tokens`` common words, seeded by ``key`` (stable across runs)."""
    rng = random.Random(zlib.crc32(key.encode("utf-8")))
    return " ".join(rng.choice(_VOCAB) for _ in range(max(1, num_tokens)))


def corpus_or_filler(doc_id: str, num_tokens: int) -> str:
    """The corpus text for a corpus doc id (``Title`` or chunk id ``Title#i``), else filler."""
    doc = documents_by_id().get(doc_id.split("#", 1)[0])
    return doc.text if doc is not None else filler_text(doc_id, num_tokens)


class TraceReplayer:
    def __init__(self, multiplier: float = 1.0, text_for: TextFor = corpus_or_filler,
                 clock: Callable[[], float] = time.monotonic):
        if multiplier <= 0:
            raise ValueError(f"delay multiplier must be > 0, got {multiplier}")
        self.multiplier = multiplier
        self._text_for = text_for
        self._clock = clock

    async def stream(self, trace: QueryTrace) -> ContextStream:
        stretched = trace.stretched(self.multiplier)
        # texts are made before the clock starts, so building them never delays an emission
        prepared = [self._to_event(stretched, i) for i in range(len(stretched.events))]
        start = self._clock()
        lateness = 0.0
        for event, out in zip(stretched.events, prepared):
            delay = start + event.end_s - self._clock()
            if delay > 0:
                await asyncio.sleep(delay)
            lateness = max(lateness, self._clock() - start - event.end_s)
            if isinstance(out, AppendChunk):
                out = replace(out, started_at=start + event.start_s)
            yield out
        yield Done({"query_id": trace.query_id, "events": len(trace.events), "multiplier": self.multiplier,
                    "max_lateness_s": round(lateness, 5), "elapsed_s": round(self._clock() - start, 5)})

    def _to_event(self, trace: QueryTrace, i: int):
        event = trace.events[i]
        if trace.shape == "vector":
            return ReplaceContext(tuple(
                Chunk(self._text_for(d, trace.doc_tokens.get(d, 0)), d, d, d, trace.doc_tokens.get(d, 0))
                for d in event.doc_ids))
        key = f"{trace.query_id}/{i}"
        text = event.text or filler_text(key, event.num_tokens)
        source = event.doc_ids[0] if event.doc_ids else key
        return AppendChunk(text, source, source, event.source or "chunk", event.num_tokens)
