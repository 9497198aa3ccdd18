"""The local corpus site: pages with boilerplate, search ranking, robots, latency model."""

import statistics

import aiohttp
import pytest
import pytest_asyncio

from stream2llm.data.corpus import load_documents, load_grounded_questions
from retrievers.local_site import GAP_MEAN_S, GAP_MEDIAN_S, LatencyModel, LocalSite, SiteConfig
from retrievers.site_search import SearchIndex

pytestmark = pytest.mark.timeout(60)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def site():
    async with LocalSite(SiteConfig(latency_scale=0)) as s:
        yield s


async def test_article_page_has_boilerplate_around_text(site):
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{site.base_url}/wiki/France") as r:
            assert r.status == 200 and r.content_type == "text/html"
            page = await r.text()
    assert "cookie-banner" in page and "<nav" in page and "<footer>" in page and "Related articles" in page
    assert "French Republic" in page


async def test_search_endpoint(site):
    async with aiohttp.ClientSession() as http:
        async with http.get(site.search_url, params={"q": "What is the capital of Peru?", "k": "3"}) as r:
            body = await r.json()
        assert body["results"][0]["url"] == "/wiki/Peru" and len(body["results"]) == 3
        for bad in ({"q": ""}, {"q": "x", "k": "0"}, {"q": "x", "k": "abc"}):
            async with http.get(site.search_url, params=bad) as r:
                assert r.status == 400
        async with http.get(f"{site.base_url}/robots.txt") as r:
            assert "Disallow: /private/" in await r.text()
        async with http.get(f"{site.base_url}/wiki/No_such_page") as r:
            assert r.status == 404


def test_grounded_questions_rank_their_country_first():
    index = SearchIndex(load_documents())
    questions = load_grounded_questions()
    top1 = sum(index.search(q.question, 1)[0][0].doc_id == q.doc_id for q in questions)
    assert top1 / len(questions) >= 0.95  # measured 152/152


def test_latency_model_matches_workload_gaps():
    model = LatencyModel(scale=1.0, seed=3)
    draws = [model.draw() for _ in range(20000)]
    assert abs(statistics.median(draws) - GAP_MEDIAN_S) < 0.05
    assert abs(statistics.mean(draws) - GAP_MEAN_S) < 0.08
    assert LatencyModel(scale=1.0, seed=3).draw() == draws[0]  # seeded
    assert LatencyModel(scale=0.0, seed=3).draw() == 0.0


def test_binds_loopback_only():
    with pytest.raises(ValueError, match="loopback"):
        LocalSite(SiteConfig(host="0.0.0.0"))
