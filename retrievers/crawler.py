"""The streaming web crawler: search step or seed URLs, concurrent guarded fetches, trafilatura
extraction in a thread pool, one event per page as soon as it is extracted (arrival order)."""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from collections.abc import Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field

from .chunking import CountTokens, chunk_text, token_counter
from .crawler_config import CrawlerConfig
from .events import AppendChunk, ContextStream, Done, SourceError
from .extract import Extracted, extract_async
from .fetch import FetchError, Page, fetch_page, make_session
from .netguard import Allowlist, GuardedResolver
from .robots import RobotsCache
from .search_client import format_results, search

SEARCH_SOURCE = "search"


@dataclass
class _Arrival:
    rank: int
    url: str
    started_at: float
    page: Page | None = None
    extracted: Extracted | None = None
    error: str | None = None


@dataclass
class _Stats:
    pages: int = 0
    errors: int = 0
    duplicates: list[str] = field(default_factory=list)
    extract_s: list[float] = field(default_factory=list)


class Crawler:
    """``Crawler(config, count_tokens).stream(query=..., seeds=...)`` yields context events.

    ``resolver`` is the DNS resolver under the SSRF guard (tests inject one); ``executor`` runs
    trafilatura (one is made per stream when not given)."""

    def __init__(self, config: CrawlerConfig, count_tokens=None, executor: Executor | None = None,
                 resolver=None):
        self.config = config
        self._count: CountTokens = token_counter(count_tokens)
        self._executor = executor
        self._resolver = resolver
        self._allowlist = Allowlist(config.allowlist)

    async def stream(self, query: str | None = None, seeds: Sequence[str] = ()) -> ContextStream:
        if not query and not seeds:
            raise ValueError("Crawler.stream needs a query (with search_url) or seed URLs")
        if query and not seeds and not self.config.search_url:
            raise ValueError("a query without seeds needs CrawlerConfig.search_url")
        start = time.monotonic()
        deadline = start + self.config.total_budget_s
        executor = self._executor or ThreadPoolExecutor(self.config.extract_workers, "extract")
        session = make_session(self.config, GuardedResolver(self._allowlist, self._resolver))
        robots = RobotsCache(session, self.config.user_agent, self._allowlist)
        tasks: list[asyncio.Task] = []
        stats = _Stats()
        try:
            urls = list(seeds)
            if query and self.config.search_url:
                async for event in self._search(session, query, deadline, urls):
                    yield event
            queue: asyncio.Queue[_Arrival] = asyncio.Queue()
            may_fetch = robots.allowed if self.config.respect_robots else None
            for rank, url in enumerate(_unique(urls)[: self.config.max_pages]):
                tasks.append(asyncio.create_task(
                    self._crawl_one(session, executor, may_fetch, rank, url, queue)))
            timed_out = False
            seen: dict[str, str] = {}
            for _ in tasks:
                arrival = await _get_before(queue, deadline)
                if arrival is None:
                    timed_out = True
                    break
                for event in self._events_for(arrival, seen, stats):
                    yield event
            yield Done(self._summary(stats, len(tasks), timed_out, start))
        finally:
            await _cancel_all(tasks)
            robots.close()
            await session.close()
            if self._executor is None:
                executor.shutdown(wait=False, cancel_futures=True)

    async def _search(self, session, query: str, deadline: float, urls: list[str]):
        started = time.monotonic()
        try:
            results = await asyncio.wait_for(search(session, query, self.config, self._allowlist),
                                             max(0.0, deadline - started))
        except FetchError as exc:
            yield SourceError(SEARCH_SOURCE, exc.reason)
            return
        except asyncio.TimeoutError:
            yield SourceError(SEARCH_SOURCE, "total time budget spent in the search step")
            return
        urls.extend(r.url for r in results)
        if self.config.emit_search_snippets and results:
            text = format_results(query, results[: self.config.max_pages])
            for piece in chunk_text(text, self.config.chunk_tokens, self._count):
                yield AppendChunk(piece, SEARCH_SOURCE, self.config.search_url, f"Search: {query}",
                                  self._count(piece), started)

    async def _crawl_one(self, session, executor, may_fetch, rank: int, url: str,
                         queue: asyncio.Queue) -> None:
        arrival = _Arrival(rank, url, time.monotonic())
        try:
            arrival.page = await fetch_page(session, url, self.config, self._allowlist, may_fetch)
            arrival.extracted = await extract_async(executor, arrival.page.text, arrival.page.final_url)
        except FetchError as exc:
            arrival.error = exc.reason
        except Exception as exc:  # noqa: BLE001 - one bad page must not end the stream
            arrival.error = f"{type(exc).__name__}: {exc}"
        queue.put_nowait(arrival)

    def _events_for(self, arrival: _Arrival, seen: dict[str, str], stats: _Stats):
        if arrival.error is not None:
            stats.errors += 1
            yield SourceError(arrival.url, arrival.error)
            return
        extracted = arrival.extracted
        stats.extract_s.append(extracted.seconds)
        if len(extracted.text) < self.config.min_text_chars:
            stats.errors += 1
            yield SourceError(arrival.url, "no main text extracted")
            return
        digest = _content_hash(extracted.text)
        if digest in seen:
            stats.duplicates.append(f"{arrival.page.final_url} = {seen[digest]}")
            return
        seen[digest] = arrival.page.final_url
        stats.pages += 1
        title = extracted.title or arrival.page.final_url
        for piece in chunk_text(extracted.text, self.config.chunk_tokens, self._count):
            yield AppendChunk(piece, f"web:{arrival.rank}", arrival.page.final_url, title,
                              self._count(piece), arrival.started_at)

    @staticmethod
    def _summary(stats: _Stats, launched: int, timed_out: bool, start: float) -> dict:
        extract = stats.extract_s
        return {
            "pages": stats.pages, "errors": stats.errors, "duplicates": stats.duplicates,
            "launched": launched, "timed_out": timed_out,
            "elapsed_s": round(time.monotonic() - start, 4),
            "extract_ms_mean": round(1000 * sum(extract) / len(extract), 3) if extract else None,
        }


def _unique(urls: list[str]) -> list[str]:
    return list(dict.fromkeys(urls))


def _content_hash(text: str) -> str:
    normal = re.sub(r"\s+", " ", text).strip().lower()
    return hashlib.sha256(normal.encode("utf-8")).hexdigest()


async def _get_before(queue: asyncio.Queue, deadline: float):
    try:
        return await asyncio.wait_for(queue.get(), max(0.0, deadline - time.monotonic()))
    except asyncio.TimeoutError:
        return None


async def _cancel_all(tasks: list[asyncio.Task]) -> None:
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)
