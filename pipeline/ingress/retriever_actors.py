"""Adapter to the retriever Ray actors (`retrievers.ray_actors`, streaming generators).

Crawl, search, vector and trace sources run in retriever actors. The ingress resolves a source to
a `RetrieverCall` (actor handle + arguments) and hands it to the session's replica, which calls the
actor's streaming generator itself (`pipeline.replica.context`): chunk text goes retriever ->
replica and never through the ingress. `stream` consumes the same call locally (the one-shot
baseline, which buffers its prompt before generating). With `retrievers.crawler_site: local` the pipeline starts
the offline corpus web site (loopback only) in a small actor and crawls/searches it.

The actors are a pool shared by every ingress replica, not owned by one: named, detached actors
(`retrievers.pool_size` per kind, with `retrievers.num_cpus` and `retrievers.resources` each, so
they can sit beside the engine replicas), which outlive any ingress replica. Their names carry a
digest of their settings: a redeploy with other settings gets new actors and removes the old ones.
The local site listens on its node's loopback, so the crawlers that fetch it are placed on its node.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import logging
from pathlib import Path

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from pipeline.control.central import NAMESPACE
from pipeline.errors import BadRequest, SourceUnavailable
from pipeline.replica.context import RetrieverCall, pull

# A retriever actor that dies (its node, an OOM) comes back; a stream cut by the death ends its
# session's retrieval with a source_error (the answer uses the context so far), and the next
# session gets the restarted actor.
RESTART = {"max_restarts": -1, "max_task_retries": 0}
log = logging.getLogger("stream2llm.retrievers")


@ray.remote(num_cpus=0)
class LocalSiteActor:
    """Serves the offline corpus site in this actor's event loop."""

    async def start(self, latency_scale: float) -> dict:
        """The site's addresses; started by the first call. Calls that come while it starts (every
        ingress replica warms its pools at once) wait for that start: before it, the port is unknown."""
        if not hasattr(self, "_opening"):
            self._opening = asyncio.ensure_future(self._open(latency_scale))
        s = await asyncio.shield(self._opening)
        return {"base_url": s.base_url, "search_url": s.search_url, "allowlist": s.allowlist_entry,
                "node_id": ray.get_runtime_context().get_node_id()}

    async def _open(self, latency_scale: float):
        from retrievers.local_site import LocalSite, SiteConfig

        return await LocalSite(SiteConfig(latency_scale=latency_scale)).__aenter__()


class RetrieverActors:
    def __init__(self, config):
        self._settings = config.retrievers
        self._prefix = f"{config.scheduler.actor_name}_retriever"
        self._pools: dict[str, list] = {}
        self._turn = itertools.count()
        self._site: dict | None = None
        self._lock = asyncio.Lock()

    async def warm(self) -> list[str]:
        """Start the crawler and vector pools before their first request and wait until their actors
        are up; returns the kinds started. A pool that cannot start yet (no vector index built) is
        left to its first request, which gets the clear error."""
        started = []
        for kind, start in (("crawler", self._crawler), ("vector", lambda: self._vector(self._settings.vector_top_k))):
            try:
                await (await start()).__ray_ready__.remote()
                started.append(kind)
            except SourceUnavailable as e:
                log.info("retriever pool %s not started ahead: %s", kind, e.reason)
            except Exception as e:  # its first request starts it again and reports what fails
                log.warning("retriever pool %s failed to start ahead: %r", kind, e)
        return started

    def stream(self, source, question: str):
        """The source's events, consumed here (the one-shot baseline)."""
        async def events():
            async for event in pull(await self.call(source, question)):
                yield event

        return events()

    async def call(self, source, question: str) -> RetrieverCall:
        """The retriever actor and arguments of a source, for a replica to call."""
        if source.type in ("crawl", "search"):
            actor = await self._crawler()
            if source.type == "crawl":
                return RetrieverCall(actor, (None, [self._absolute(u) for u in source.seed_urls]))
            return RetrieverCall(actor, (source.query or question,))
        if source.type == "trace":
            return await self._replay(source.trace)
        if source.type == "vector":
            actor = await self._vector(source.top_k or self._settings.vector_top_k)
            return RetrieverCall(actor, (source.query or question,))
        raise BadRequest(f"no retriever actor for source type {source.type!r}")

    async def _crawler(self):
        async with self._lock:
            if "crawler" not in self._pools:
                from retrievers.crawler_config import CrawlerConfig
                from retrievers.ray_actors import CrawlerActor

                site = await self._local_site()
                allowlist = list(self._settings.crawler_allowlist) + ([site["allowlist"]] if site else [])
                config = CrawlerConfig(search_url=f"{self._site_base()}/search",
                                       max_pages=self._settings.crawler_max_pages, allowlist=tuple(allowlist))
                # the local site answers on its node's loopback only: its crawlers run there
                near = {"scheduling_strategy": NodeAffinitySchedulingStrategy(site["node_id"], soft=False)} if site else {}
                self._pools["crawler"] = self._pool("crawler", CrawlerActor, (config,), {**self._actor_options(), **near})
        return self._pick("crawler")

    def _actor_options(self) -> dict:
        return {**self._settings.actor_options(), **RESTART}

    def _pool(self, kind: str, cls, args: tuple, options: dict, size: int | None = None) -> list:
        """`size` (default `pool_size`) named detached actors of `kind`, created here unless they
        exist; actors of this kind with other settings (an earlier deployment's) are removed."""
        plain = {k: v for k, v in options.items() if k != "scheduling_strategy"}  # no object reprs
        digest = hashlib.blake2b(json.dumps([repr(args), plain], sort_keys=True, default=str).encode(),
                                 digest_size=4).hexdigest()
        stem = f"{self._prefix}_{kind}_"
        for named in ray.util.list_named_actors(all_namespaces=True):
            name = named["name"]
            if named["namespace"] == NAMESPACE and name.startswith(stem) and not name.startswith(f"{stem}{digest}_"):
                try:
                    ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
                except ValueError:  # gone meanwhile
                    pass
        return [cls.options(name=f"{stem}{digest}_{i}", namespace=NAMESPACE, lifetime="detached",
                            get_if_exists=True, **options).remote(*args)
                for i in range(size or self._settings.pool_size)]

    def _pick(self, kind: str):
        """The pool's actors in turn."""
        pool = self._pools[kind]
        return pool[next(self._turn) % len(pool)]

    def _site_base(self) -> str:
        return (self._site["base_url"] if self._site else self._settings.crawler_site).rstrip("/")

    def _absolute(self, url: str) -> str:
        """Seed URLs may be paths on the configured site (`/wiki/Kenya`)."""
        return f"{self._site_base()}{url}" if url.startswith("/") else url

    async def _local_site(self) -> dict | None:
        if self._settings.crawler_site != "local":
            return None
        if self._site is None:
            # where the pool goes (`retrievers.resources`): its crawlers must run on the site's node
            [actor] = self._pool("site", LocalSiteActor, (), {**self._actor_options(), "num_cpus": 0}, size=1)
            self._site = await actor.start.remote(self._settings.site_latency_scale)
        return self._site

    async def _vector(self, k: int):
        key = f"vector{k}"
        async with self._lock:
            if key not in self._pools:
                from retrievers.ray_actors import VectorActor
                from retrievers.vector_index import IndexSpec, index_dir

                path = Path(self._settings.vector_index or index_dir(IndexSpec()))
                if not path.exists():
                    raise SourceUnavailable(f"no vector index at {path}; build it with `stream2llm index`")
                self._pools[key] = self._pool(key, VectorActor, (str(path), k, None, self._settings.vector_on_gpu),
                                              {**self._settings.vector_actor_options(), **RESTART})
        return self._pick(key)

    async def _replay(self, name: str):
        from retrievers.ray_actors import ReplayActor

        trace = load_trace(self._trace_dir(), name)
        if "replay" not in self._pools:
            self._pools["replay"] = self._pool("replay", ReplayActor, (self._settings.trace_multiplier,),
                                               self._actor_options())
        return RetrieverCall(self._pick("replay"), (trace,))

    def _trace_dir(self) -> Path:
        if self._settings.trace_dir:
            return Path(self._settings.trace_dir)
        from stream2llm.paths import cache_path

        return Path(cache_path("traces"))


def load_trace(folder: Path, name: str):
    """The first query of a recorded trace file, by plain file name (no paths: no traversal)."""
    from stream2llm.data.traces import TraceFormatError, read_crawler_csv, read_vector_csv

    if Path(name).name != name or not name.endswith(".csv"):
        raise BadRequest(f"trace must be a plain .csv file name, got {name!r}")
    path = folder / name
    if not path.is_file():
        raise BadRequest(f"no trace {name!r} in {folder}")
    header = path.open(encoding="utf-8").readline()
    try:
        traces = read_vector_csv(path) if "PipelinePool" in header else read_crawler_csv(path)
    except TraceFormatError as e:
        raise BadRequest(f"trace {name!r} is malformed: {e}") from None
    return traces[0]
