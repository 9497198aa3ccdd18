"""The retriever actors as a pool shared by every ingress replica (pipeline.ingress.retriever_actors),
with real Ray actors and the real crawler on the offline corpus site: named detached actors that
outlive the process that created them, calls spread over the pool, the crawlers on the local
site's node (trivially here: one node; the option is a hard node affinity), and a redeploy with other settings replacing the old actors rather than reusing them."""

import asyncio
import time

import ray

from pipeline.config import AppConfig
from pipeline.control.central import NAMESPACE
from pipeline.ingress.retriever_actors import RetrieverActors
from pipeline.replica.context import pull
from pipeline.schemas import Source
from retrievers.events import AppendChunk, Done


def named(prefix: str) -> set[str]:
    return {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["namespace"] == NAMESPACE and a["name"].startswith(prefix)}


def test_a_pool_of_shared_retrievers_beside_the_site_and_replaced_on_new_settings(local_ray):
    config = {"scheduler": {"actor_name": "pooltest"}, "retrievers": {"pool_size": 2, "crawler_max_pages": 2}}

    async def scenario():
        first = RetrieverActors(AppConfig.model_validate(config))
        calls = [await first.call(Source(type="search", query=q), q) for q in ("France", "Kenya")]
        events = [[e async for e in pull(c)] for c in calls]
        other = RetrieverActors(AppConfig.model_validate(config))  # another ingress: the same pool
        again = await other.call(Source(type="search", query="Peru"), "Peru")
        return calls, events, again

    calls, events, again = asyncio.run(scenario())
    assert calls[0].actor._actor_id != calls[1].actor._actor_id  # spread over the pool
    assert again.actor._actor_id in {c.actor._actor_id for c in calls}  # shared, not per ingress
    for run in events:
        assert any(isinstance(e, AppendChunk) for e in run) and isinstance(run[-1], Done), run
    crawlers = named("pooltest_retriever_crawler_")
    assert len(crawlers) == 2 and len(named("pooltest_retriever_site_")) == 1
    from ray._private.state import actors  # the GCS's actor table: where each actor runs

    nodes = {a["Name"]: a["Address"]["NodeID"] for a in actors().values() if a["State"] == "ALIVE"}
    [site] = named("pooltest_retriever_site_")
    assert {nodes[c] for c in crawlers} == {nodes[site]}  # the crawlers run on the site's node

    changed = {**config, "retrievers": {"pool_size": 1, "crawler_max_pages": 3}}
    asyncio.run(RetrieverActors(AppConfig.model_validate(changed)).call(Source(type="search", query="x"), "x"))
    deadline = time.monotonic() + 30
    while named("pooltest_retriever_crawler_") & crawlers and time.monotonic() < deadline:
        time.sleep(0.2)
    now = named("pooltest_retriever_crawler_")
    assert len(now) == 1 and not now & crawlers  # the old settings' actors are gone, not reused
    for name in named("pooltest_retriever_"):
        ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)


def test_ingress_replicas_warming_at_once_share_one_started_site_and_pool(local_ray):
    """Every ingress replica warms its pools as it starts, so two ask the site at the same moment:
    both get its address (a caller that came while it started once got no port), and the same
    crawler actors, which then fetch from it."""
    config = AppConfig.model_validate({"scheduler": {"actor_name": "warmtest"}, "retrievers": {"crawler_max_pages": 2}})

    async def scenario():
        ingresses = [RetrieverActors(config) for _ in range(3)]
        warmed = await asyncio.gather(*(i.warm() for i in ingresses))
        sites = [i._site for i in ingresses]
        call = await ingresses[1].call(Source(type="search", query="France"), "France")
        return warmed, sites, [e async for e in pull(call)]

    warmed, sites, events = asyncio.run(scenario())
    assert all("crawler" in kinds for kinds in warmed), warmed
    assert all(s["base_url"] == sites[0]["base_url"] and not s["base_url"].endswith(":None") for s in sites), sites
    assert len(named("warmtest_retriever_crawler_")) == 1
    assert any(isinstance(e, AppendChunk) for e in events) and isinstance(events[-1], Done), events
    for name in named("warmtest_retriever_"):
        ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
