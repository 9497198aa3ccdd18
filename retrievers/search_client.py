"""The crawler's search step: ask a search endpoint for result links (JSON)."""

from __future__ import annotations

import json
from dataclasses import replace
from urllib.parse import urlencode, urljoin

import aiohttp
from pydantic import BaseModel, ValidationError

from .crawler_config import CrawlerConfig
from .fetch import FetchError, fetch_page
from .netguard import Allowlist


class SearchResult(BaseModel):
    url: str
    title: str = ""
    snippet: str = ""


class SearchResponse(BaseModel):
    results: list[SearchResult]


async def search(session: aiohttp.ClientSession, query: str, config: CrawlerConfig,
                 allowlist: Allowlist) -> list[SearchResult]:
    """Result links, made absolute; raises FetchError with a reason on any failure."""
    if not config.search_url:
        raise FetchError("search", "no search_url configured")
    url = f"{config.search_url}?{urlencode({'q': query, 'k': config.max_pages})}"
    json_config = replace(config, content_types=("application/json",))
    page = await fetch_page(session, url, json_config, allowlist)
    try:
        parsed = SearchResponse.model_validate(json.loads(page.text))
    except (json.JSONDecodeError, ValidationError) as exc:
        raise FetchError(url, f"bad search response: {type(exc).__name__}") from exc
    return [r.model_copy(update={"url": urljoin(page.final_url, r.url)}) for r in parsed.results]


def format_results(query: str, results: list[SearchResult]) -> str:
    lines = [f"Search results for: {query}"]
    lines += [f"- {r.title}: {r.snippet}".rstrip(": ") for r in results]
    return "\n".join(lines)
