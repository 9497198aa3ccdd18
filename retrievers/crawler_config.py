"""Crawler settings, with the reasons for each default."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CrawlerConfig:
    # Search step: GET {search_url}?q=...&k=max_pages returning JSON {"results": [{"url","title","snippet"}]}.
    search_url: str | None = None
    max_pages: int = 8                  # the paper's crawler workload averages ~7.9 chunks per query
    emit_search_snippets: bool = True   # first chunk = the result list (like Tavily's search step)
    concurrency: int = 8                # pages fetched at once, all hosts together
    per_host_concurrency: int = 4       # politeness: open connections per host
    connect_timeout_s: float = 3.0
    read_timeout_s: float = 5.0         # between two reads of the body
    page_timeout_s: float = 10.0        # one page, all redirect hops included
    total_budget_s: float = 20.0        # per query; the stream then ends with what it has
    max_page_bytes: int = 2_000_000     # decoded body; a larger page is dropped with an error
    max_redirects: int = 5              # each hop is re-checked (scheme, SSRF, robots)
    content_types: tuple[str, ...] = ("text/html", "application/xhtml+xml", "text/plain")
    respect_robots: bool = True
    user_agent: str = "stream2llm-crawler/0.1"
    allowlist: tuple[str, ...] = ()     # host:port pairs allowed despite internal addresses
    chunk_tokens: int = 512             # token bound of one emitted chunk
    extract_workers: int = 2            # threads running trafilatura off the event loop
    min_text_chars: int = 40            # an extraction shorter than this counts as "no main text"

    def __post_init__(self) -> None:
        positive = ("max_pages", "concurrency", "per_host_concurrency", "max_page_bytes", "chunk_tokens",
                    "extract_workers")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"CrawlerConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("connect_timeout_s", "read_timeout_s", "page_timeout_s", "total_budget_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"CrawlerConfig.{name} must be > 0, got {getattr(self, name)}")
        if self.max_redirects < 0:
            raise ValueError("CrawlerConfig.max_redirects must be >= 0")
