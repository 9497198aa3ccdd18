"""A local web to crawl: the offline Wikipedia corpus served as HTML on 127.0.0.1.

Routes: ``/`` (index), ``/wiki/{doc_id}``, ``/search?q=&k=`` (JSON links ranked by text match),
``/robots.txt`` (disallows ``/private/``), and fault routes for tests under ``/fault/``.
Per-page latency is drawn from the crawler workload's gap distribution (lognormal, median 0.70 s,
mean 1.05 s; docs/ARCHITECTURE.md, "Workload shape") times ``latency_scale`` (0 = no delay), seeded.

    async with LocalSite(SiteConfig(latency_scale=0)) as site:
        site.base_url, site.allowlist_entry
    python -m retrievers.local_site --port 8765
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from aiohttp import web

from stream2llm.data.corpus import Document, load_documents
from .site_faults import add_fault_routes
from .site_pages import article_page, home_page
from .site_search import SearchIndex

GAP_MEDIAN_S = 0.70
GAP_MEAN_S = 1.05
MAX_RESULTS = 50


@dataclass(frozen=True)
class SiteConfig:
    host: str = "127.0.0.1"        # loopback only: other values are refused
    port: int = 0                  # 0 = ephemeral
    latency_scale: float = 1.0     # multiplies the drawn per-page latency; 0 disables it
    seed: int = 0
    slow_page_s: float = 30.0      # /fault/slow sleeps this long before answering
    huge_page_bytes: int = 8_000_000
    related_links: int = 8


class LatencyModel:
    """Lognormal with the workload's median and mean: mu = ln(median), sigma^2 = 2 ln(mean/median)."""

    def __init__(self, scale: float, seed: int, median: float = GAP_MEDIAN_S, mean: float = GAP_MEAN_S):
        self._rng = random.Random(seed)
        self._mu = math.log(median)
        self._sigma = math.sqrt(2 * math.log(mean / median))
        self._scale = scale

    def draw(self) -> float:
        return 0.0 if self._scale <= 0 else self._scale * self._rng.lognormvariate(self._mu, self._sigma)


def build_app(config: SiteConfig, documents: Sequence[Document]) -> web.Application:
    docs = list(documents)
    by_id = {d.doc_id: d for d in docs}
    index = SearchIndex(docs)
    latency = LatencyModel(config.latency_scale, config.seed)
    rng = random.Random(config.seed)

    async def wiki(request: web.Request) -> web.Response:
        doc = by_id.get(request.match_info["doc_id"])
        if doc is None:
            raise web.HTTPNotFound(text="no such article")
        await asyncio.sleep(latency.draw())
        related = rng.sample(docs, min(config.related_links, len(docs)))
        return web.Response(text=article_page(doc, related), content_type="text/html")

    async def search(request: web.Request) -> web.Response:
        query = request.query.get("q", "").strip()
        if not query:
            raise web.HTTPBadRequest(text="missing query parameter q")
        try:
            k = int(request.query.get("k", "10"))
        except ValueError:
            raise web.HTTPBadRequest(text="k must be an integer") from None
        if not 1 <= k <= MAX_RESULTS:
            raise web.HTTPBadRequest(text=f"k must be in 1..{MAX_RESULTS}")
        results = [{"url": f"/wiki/{d.doc_id}", "title": d.title, "snippet": d.text[:160], "score": round(s, 3)}
                   for d, s in index.search(query, k)]
        return web.json_response({"query": query, "results": results})

    async def robots(_request: web.Request) -> web.Response:
        return web.Response(text="User-agent: *\nDisallow: /private/\n", content_type="text/plain")

    async def home(_request: web.Request) -> web.Response:
        return web.Response(text=home_page(docs[:200]), content_type="text/html")

    app = web.Application()
    app.router.add_get("/", home)
    app.router.add_get("/wiki/{doc_id}", wiki)
    app.router.add_get("/search", search)
    app.router.add_get("/robots.txt", robots)
    add_fault_routes(app, config, docs)
    return app


class LocalSite:
    """Runs the site in the current event loop; ``base_url`` is known after entering."""

    def __init__(self, config: SiteConfig = SiteConfig(), documents: Sequence[Document] | None = None):
        if config.host not in ("127.0.0.1", "::1", "localhost"):
            raise ValueError(f"the local site binds loopback only, not {config.host!r}")
        self.config = config
        self._documents = documents
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    async def __aenter__(self) -> LocalSite:
        docs = self._documents if self._documents is not None else load_documents()
        self._runner = web.AppRunner(build_app(self.config, docs), handler_cancellation=True,
                                     shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.host, self.config.port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def __aexit__(self, *exc) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def base_url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    @property
    def allowlist_entry(self) -> str:
        return f"{self.config.host}:{self.port}"

    @property
    def search_url(self) -> str:
        return f"{self.base_url}/search"


async def _serve_forever(config: SiteConfig) -> None:
    async with LocalSite(config) as site:
        print(f"serving {site.base_url} (search: {site.search_url}); Ctrl-C to stop", flush=True)
        await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Serve the offline Wikipedia corpus on loopback.")
    parser.add_argument("--host", default="127.0.0.1", choices=["127.0.0.1", "::1"])
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--latency-scale", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    config = SiteConfig(host=args.host, port=args.port, latency_scale=args.latency_scale, seed=args.seed)
    try:
        asyncio.run(_serve_forever(config))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
