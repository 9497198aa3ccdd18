"""A retriever actor for tests/test_recovery_exact.py, in a module the replicas can import (the
test module itself is not on their path: a handle to an actor of a class they cannot import loses
its streaming methods' metadata)."""

from __future__ import annotations

import asyncio

import ray

from retrievers.events import AppendChunk, Done


def page(name: str, title: str, words: str) -> AppendChunk:
    return AppendChunk(text=f"{words} " * 6, source_id=name, url_or_doc_id=f"/wiki/{name}", title=title)


@ray.remote(num_cpus=0)
class ChangingCrawl:
    """A crawl whose second run differs from its first, as a live web can: run 1 finds pages A and
    B, then waits (its replica is killed there); run 2 finds B edited, then A, then a new page C."""

    def __init__(self):
        self.runs = 0

    def count_runs(self) -> int:
        return self.runs

    @ray.method(num_returns="streaming")
    async def stream(self):
        self.runs += 1
        if self.runs == 1:
            yield page("a", "A", "alpha pages about apples")
            yield page("b", "B", "beta pages about bananas")
            await asyncio.sleep(3600)
        yield page("b", "B edited", "beta pages about blueberries now")
        yield page("a", "A", "alpha pages about apples")
        yield page("c", "C", "gamma pages about cherries")
        yield Done({"chunks": 3})
