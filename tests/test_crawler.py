"""The crawler against the local site over real loopback HTTP, with every fault route."""

import asyncio
import time

import pytest
import pytest_asyncio

from retrievers.chunking import whitespace_count
from stream2llm.data.corpus import load_documents
from retrievers.crawler import Crawler
from retrievers.crawler_config import CrawlerConfig
from retrievers.events import AppendChunk, Done, SourceError, collect
from retrievers.local_site import LocalSite, SiteConfig

pytestmark = pytest.mark.timeout(60)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def site():
    async with LocalSite(SiteConfig(latency_scale=0, slow_page_s=1.5, huge_page_bytes=3_000_000)) as s:
        yield s


def config_for(site, **overrides) -> CrawlerConfig:
    base = dict(search_url=site.search_url, allowlist=(site.allowlist_entry,), page_timeout_s=1.0,
                max_page_bytes=1_000_000, max_pages=20)
    return CrawlerConfig(**{**base, **overrides})


async def test_search_step_then_pages(site):
    events = await collect(Crawler(config_for(site, max_pages=5)).stream("What is the capital of France?"))
    assert isinstance(events[0], AppendChunk) and events[0].source_id == "search"
    pages = [e for e in events if isinstance(e, AppendChunk) and e.source_id != "search"]
    assert len(pages) == 5
    assert any(e.url_or_doc_id.endswith("/wiki/France") and "Paris" in e.text for e in pages)
    france = next(e for e in pages if e.url_or_doc_id.endswith("/wiki/France"))
    assert "cookies" not in france.text and "Privacy policy" not in france.text  # boilerplate removed
    assert isinstance(events[-1], Done) and events[-1].summary["pages"] == 5


async def test_pages_arrive_in_completion_order_not_rank_order(site):
    seeds = [f"{site.base_url}/fault/slow", f"{site.base_url}/wiki/France"]
    stream = Crawler(config_for(site, page_timeout_s=5.0)).stream(seeds=seeds)
    start = time.monotonic()
    first = await stream.__anext__()
    first_at = time.monotonic() - start
    rest = [e async for e in stream]
    assert first.url_or_doc_id.endswith("/wiki/France")
    assert first_at < 1.0  # emitted long before the slow page (1.5 s) is done
    assert [e.source_id for e in rest if isinstance(e, AppendChunk)] == ["web:0"]


FAULTS = {
    "/fault/404": "HTTP 404",
    "/fault/500": "HTTP 500",
    "/fault/slow": "timed out",
    "/fault/huge": "max_page_bytes",
    "/fault/binary": "content type",
    "/fault/loop-a": "redirect loop",
    "/private/secret": "robots.txt",
    "/fault/empty": "no main text",
}


async def test_each_fault_reported_and_stream_goes_on(site):
    seeds = [site.base_url + path for path in FAULTS] + [f"{site.base_url}/wiki/Japan"]
    events = await collect(Crawler(config_for(site)).stream(seeds=seeds))
    errors = {e.source.removeprefix(site.base_url): e.reason for e in events if isinstance(e, SourceError)}
    for path, expected in FAULTS.items():
        assert expected in errors[path], (path, errors[path])
    pages = [e for e in events if isinstance(e, AppendChunk)]
    assert [p.url_or_doc_id for p in pages] == [f"{site.base_url}/wiki/Japan"]
    assert "Tokyo" in pages[0].text
    assert isinstance(events[-1], Done) and events[-1].summary["errors"] == len(FAULTS)


async def test_redirect_limit(site):
    hop = f"{site.base_url}/fault/redirect?to=/wiki/Japan"
    events = await collect(Crawler(config_for(site, max_redirects=0)).stream(seeds=[hop]))
    assert "more than 0 redirects" in events[0].reason
    events = await collect(Crawler(config_for(site, max_redirects=1)).stream(seeds=[hop]))
    assert events[0].url_or_doc_id.endswith("/wiki/Japan")


async def test_bad_charset_is_decoded_by_fallback(site):
    events = await collect(Crawler(config_for(site)).stream(seeds=[f"{site.base_url}/fault/bad-charset"]))
    assert isinstance(events[0], AppendChunk)
    assert "Café society and naïve façades" in events[0].text


async def test_duplicate_content_is_dropped(site):
    first = load_documents()[0].doc_id
    seeds = [f"{site.base_url}/wiki/{first}", f"{site.base_url}/fault/duplicate"]
    events = await collect(Crawler(config_for(site)).stream(seeds=seeds))
    assert len([e for e in events if isinstance(e, AppendChunk)]) == 1
    assert len(events[-1].summary["duplicates"]) == 1


async def test_robots_can_be_turned_off(site):
    seeds = [f"{site.base_url}/private/secret"]
    events = await collect(Crawler(config_for(site, respect_robots=False)).stream(seeds=seeds))
    assert isinstance(events[0], AppendChunk)


async def test_total_budget_ends_stream_with_what_it_has(site):
    seeds = [f"{site.base_url}/wiki/Japan", f"{site.base_url}/fault/slow"]
    start = time.monotonic()
    events = await collect(Crawler(config_for(site, page_timeout_s=5.0, total_budget_s=0.6)).stream(seeds=seeds))
    assert time.monotonic() - start < 1.2
    assert [type(e) for e in events] == [AppendChunk, Done]
    assert events[-1].summary["timed_out"] is True


async def test_chunks_are_token_bounded(site):
    cfg = config_for(site, chunk_tokens=30, emit_search_snippets=False)
    events = await collect(Crawler(cfg, count_tokens=whitespace_count).stream(seeds=[f"{site.base_url}/wiki/France"]))
    chunks = [e for e in events if isinstance(e, AppendChunk)]
    assert len(chunks) > 3
    assert all(0 < whitespace_count(c.text) <= 30 and c.num_tokens == whitespace_count(c.text) for c in chunks)
    assert {c.source_id for c in chunks} == {"web:0"}


async def test_early_close_cancels_fetches(site):
    seeds = [f"{site.base_url}/wiki/Japan", f"{site.base_url}/fault/slow"]
    before = len(asyncio.all_tasks())
    stream = Crawler(config_for(site, page_timeout_s=5.0)).stream(seeds=seeds)
    await stream.__anext__()
    await stream.aclose()
    deadline = time.monotonic() + 30  # cancelled fetches end within a few loop turns; a loaded box is slow
    while len(asyncio.all_tasks()) > before and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert len(asyncio.all_tasks()) <= before


async def test_bad_config_and_bad_call():
    with pytest.raises(ValueError, match="concurrency"):
        CrawlerConfig(concurrency=0)
    with pytest.raises(ValueError, match="search_url"):
        await collect(Crawler(CrawlerConfig()).stream("q"))
    with pytest.raises(ValueError, match="seed URLs"):
        await collect(Crawler(CrawlerConfig()).stream())


async def test_unreachable_origin_says_so(site):
    import socket

    with socket.socket() as s:  # a loopback port with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    events = await collect(Crawler(CrawlerConfig(allowlist=(f"127.0.0.1:{port}",))).stream(seeds=[f"http://127.0.0.1:{port}/x"]))
    assert "robots.txt unreachable" in events[0].reason
    events = await collect(Crawler(CrawlerConfig(allowlist=(f"127.0.0.1:{port}",), respect_robots=False))
                           .stream(seeds=[f"http://127.0.0.1:{port}/x"]))
    assert "connect failed" in events[0].reason
