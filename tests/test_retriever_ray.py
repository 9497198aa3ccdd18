"""Retrievers as Ray actors with streaming-generator methods (real Ray, loopback site)."""

import time

import pytest
import pytest_asyncio
import ray

from retrievers.crawler_config import CrawlerConfig
from retrievers.events import AppendChunk, Done
from retrievers.local_site import LocalSite, SiteConfig
from stream2llm.data.traces import synthetic_crawler_traces

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def ray_local():
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    if started:
        ray.shutdown()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def site():
    async with LocalSite(SiteConfig(latency_scale=0.2, seed=2)) as s:
        yield s


async def test_crawler_actor_streams_events_as_found(ray_local, site):
    from retrievers.ray_actors import CrawlerActor

    config = CrawlerConfig(search_url=site.search_url, allowlist=(site.allowlist_entry,), max_pages=4)
    actor = CrawlerActor.remote(config)
    start = time.monotonic()
    arrivals = []
    async for ref in actor.stream.remote(query="What is the capital of Kenya?"):
        arrivals.append((time.monotonic() - start, await ref))
    events = [e for _, e in arrivals]
    assert isinstance(events[-1], Done) and events[-1].summary["pages"] == 4
    assert any(isinstance(e, AppendChunk) and e.url_or_doc_id.endswith("/wiki/Kenya") for e in events)
    pages = [t for t, e in arrivals if isinstance(e, AppendChunk) and e.source_id != "search"]
    assert pages[0] < pages[-1] - 0.05  # pages arrive one by one, not in a batch at the end
    ray.kill(actor)


async def test_replay_actor_streams_trace(ray_local):
    from retrievers.ray_actors import ReplayActor

    trace = synthetic_crawler_traces(1, seed=3)[0]
    actor = ReplayActor.remote(0.05)
    events = [await ref async for ref in actor.stream.remote(trace)]
    assert [e.num_tokens for e in events[:-1]] == [e.num_tokens for e in trace.events]
    assert events[-1].summary["events"] == len(trace.events)
    ray.kill(actor)


async def test_vector_actor_streams_replace_events(ray_local, tmp_path):
    from retrievers.embedding import Embedder
    from retrievers.events import ReplaceContext
    from retrievers.ray_actors import VectorActor
    from retrievers.vector_index import IndexSpec, build_index

    index = build_index(IndexSpec(subset_others=8, grounded_limit=8, nlist=4), tmp_path / "idx", Embedder(),
                        progress=False)
    actor = VectorActor.remote(str(index.path), k=3)
    events = [await ref async for ref in actor.stream.remote("What is the capital of Afghanistan?")]
    assert isinstance(events[-1], Done) and events[-1].summary["probed"] == 4
    final = [e for e in events if isinstance(e, ReplaceContext)][-1]
    assert len(final.chunks) == 3
    ray.kill(actor)
