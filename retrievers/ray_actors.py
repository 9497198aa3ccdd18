"""Ray actor wrappers: each retriever as an actor whose ``stream`` method is a streaming
generator (``num_returns="streaming"``), so the pipeline passes the event stream between actors.

    actor = CrawlerActor.remote(config, tokenizer="path/to/hf/tokenizer")
    async for ref in actor.stream.remote(query="..."):
        event = await ref

Only this module imports Ray; the rest of ``retrievers`` works without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import ray

from .crawler_config import CrawlerConfig
from stream2llm.data.traces import QueryTrace


def _counter(tokenizer):
    """A path or hub-less name of a HF tokenizer is loaded inside the actor; callables pass through."""
    if isinstance(tokenizer, (str, Path)):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer))
    from .chunking import token_counter

    return token_counter(tokenizer)


@ray.remote(num_cpus=0.5)
class CrawlerActor:
    def __init__(self, config: CrawlerConfig, tokenizer=None):
        from .crawler import Crawler

        self._crawler = Crawler(config, _counter(tokenizer))

    @ray.method(num_returns="streaming")
    async def stream(self, query: str | None = None, seeds: Sequence[str] = ()):
        async for event in self._crawler.stream(query, seeds):
            yield event


@ray.remote(num_cpus=0.5)
class VectorActor:
    """Loads the index at ``index_path`` (build it first with ``ensure_index``)."""

    def __init__(self, index_path: str, k: int = 5, tokenizer=None, use_gpu: bool = False):
        from .embedding import shared_embedder
        from .vector import VectorRetriever
        from .vector_index import load_index

        # With a GPU share Ray sets CUDA_VISIBLE_DEVICES to the GPU it assigned: "cuda" and FAISS
        # device 0 are that GPU. Without one, both stay on the CPU even on a GPU node.
        embedder = shared_embedder("cuda" if use_gpu else "cpu")
        self._retriever = VectorRetriever(load_index(Path(index_path)), embedder, k, _counter(tokenizer),
                                          use_gpu=use_gpu)

    def on_gpu(self) -> bool:
        return self._retriever.on_gpu

    @ray.method(num_returns="streaming")
    async def stream(self, query: str):
        async for event in self._retriever.stream(query):
            yield event


@ray.remote(num_cpus=0.25)
class ReplayActor:
    def __init__(self, multiplier: float = 1.0):
        from .replay import TraceReplayer

        self._replayer = TraceReplayer(multiplier)

    @ray.method(num_returns="streaming")
    async def stream(self, trace: QueryTrace):
        async for event in self._replayer.stream(trace):
            yield event
