"""Progressive FAISS retrieval: probe inverted lists in growing batches and emit the current
top-k as a ReplaceContext whenever the set changes.

Probing schedule: cumulative nprobe 1, 2, 4, ... up to nlist; each step scans only the lists it
adds (``search_preassigned`` on the lists ranked by the coarse quantizer) and merges them into
the running top-k, so the final step has scanned every list: its top-k equals exact search.

Stable order rule ("first seen"): a chunk keeps its position relative to the chunks that were
already in the context; chunks that enter at the same step follow, by descending score; a chunk
that leaves and re-enters counts as new. A refinement then changes the context only from the
first dropped chunk on (mostly the tail), which keeps the engine's KV prefix (docs/ARCHITECTURE.md, "Update mode").
"""

from __future__ import annotations

import asyncio
import time

import faiss
import numpy as np

from .chunking import token_counter
from .events import Chunk, ContextStream, Done, ReplaceContext, SourceError
from .vector_index import VectorIndex


def probe_schedule(nlist: int, first: int = 1, growth: int = 2) -> list[int]:
    """Cumulative nprobe values, e.g. nlist=12 -> [1, 2, 4, 8, 12]."""
    if first < 1 or growth < 2:
        raise ValueError("first must be >= 1 and growth >= 2")
    steps, nprobe = [], first
    while nprobe < nlist:
        steps.append(nprobe)
        nprobe *= growth
    return steps + [nlist]


def stable_order(previous: list[int], top: dict[int, float]) -> list[int]:
    """The first-seen rule: kept ids in their previous order, then newcomers by score."""
    kept = [i for i in previous if i in top]
    newcomers = sorted((i for i in top if i not in set(kept)), key=lambda i: (-top[i], i))
    return kept + newcomers


class GpuUnavailableError(RuntimeError):
    """A GPU search was asked for where FAISS has no GPU."""


def to_gpu_if_available(index: faiss.Index):
    """(gpu index, its resources) with faiss-gpu and a visible GPU, else (None, None).

    The resources object must outlive the index, so the caller keeps both."""
    if hasattr(faiss, "get_num_gpus") and faiss.get_num_gpus() > 0:
        resources = faiss.StandardGpuResources()
        return faiss.index_cpu_to_gpu(resources, 0, index), resources
    return None, None


class VectorRetriever:
    """``VectorRetriever(index, embedder, k).stream(query)`` yields ReplaceContext events, then Done.

    `use_gpu`: None searches on a GPU when FAISS sees one, False never, True requires one."""

    def __init__(self, index: VectorIndex, embedder, k: int = 5, count_tokens=None,
                 first_probe: int = 1, growth: int = 2, use_gpu: bool | None = None):
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        self.index = index
        self.embedder = embedder
        self.k = k
        self.schedule = probe_schedule(index.nlist, first_probe, growth)
        self._count = token_counter(count_tokens)
        self._token_cache: dict[int, int] = {}
        self._gpu_index, self._gpu_resources = (None, None) if use_gpu is False else to_gpu_if_available(index.index)
        self.on_gpu = self._gpu_index is not None
        if use_gpu and not self.on_gpu:
            raise GpuUnavailableError("use_gpu=True, but FAISS sees no GPU (install faiss-gpu and give "
                                      "the process a GPU)")

    async def stream(self, query: str) -> ContextStream:
        if not query or not query.strip():
            raise ValueError("empty query")
        start = time.monotonic()
        vector = await asyncio.to_thread(self.embedder.embed, [query])
        embed_s = time.monotonic() - start
        lists = self.index.index.quantizer.search(vector, self.index.nlist)[1]
        scores: dict[int, float] = {}
        current: list[int] = []
        updates, probed, first_at = 0, 0, None
        try:
            for nprobe in self.schedule:
                found = await asyncio.to_thread(self._scan, vector, lists, probed, nprobe)
                scores.update(found)
                probed = nprobe
                top = dict(sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))[: self.k])
                if set(top) != set(current):
                    current = stable_order(current, top)
                    updates += 1
                    first_at = first_at or time.monotonic() - start
                    yield ReplaceContext(tuple(self._chunk(i) for i in current))
        except RuntimeError as exc:  # faiss raises RuntimeError from C++
            yield SourceError("vector", f"search failed after nprobe={probed}: {exc}")
        yield Done({"updates": updates, "nprobe_schedule": self.schedule, "probed": probed,
                    "embed_s": round(embed_s, 5), "first_result_s": first_at,
                    "elapsed_s": round(time.monotonic() - start, 5), "on_gpu": self.on_gpu,
                    "top": [(self.index.chunks[i].chunk_id, round(scores[i], 5)) for i in current]})

    def _scan(self, vector: np.ndarray, lists: np.ndarray, lo: int, hi: int) -> dict[int, float]:
        """Top-k among the lists ranked lo..hi-1 (only those lists are read)."""
        if self.on_gpu:
            with self.index.lock:  # GPU IVF has no preassigned search: re-probe all hi lists
                self._gpu_index.nprobe = hi
                distances, ids = self._gpu_index.search(vector, self.k)
        else:
            assign = np.ascontiguousarray(lists[:, lo:hi])
            with self.index.lock:  # the wrapper reads the width from index.nprobe, shared state
                self.index.index.nprobe = hi - lo
                distances, ids = self.index.index.search_preassigned(vector, self.k, assign, None)
        return {int(i): float(d) for i, d in zip(ids[0], distances[0]) if i >= 0}

    def _chunk(self, i: int) -> Chunk:
        meta = self.index.chunks[i]
        if i not in self._token_cache:
            self._token_cache[i] = self._count(meta.text)
        return Chunk(meta.text, meta.chunk_id, meta.doc_id, meta.title, self._token_cache[i])


def exact_top_k(index: VectorIndex, vector: np.ndarray, k: int) -> list[int]:
    """Brute-force top-k over the stored vectors (the reference for tests and the benchmark)."""
    scores = index.vectors @ vector[0]
    order = np.lexsort((np.arange(len(scores)), -scores))
    return [int(i) for i in order[:k]]
