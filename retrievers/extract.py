"""Main-text extraction with trafilatura, run in a thread pool so the event loop keeps fetching."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Executor
from dataclasses import dataclass

import trafilatura


@dataclass(frozen=True)
class Extracted:
    title: str
    text: str
    seconds: float  # time spent in trafilatura (for the benchmark's ms/page)


def extract_main_text(html: str, url: str) -> Extracted:
    """Blocking: the article body without navigation, sidebars and footers."""
    start = time.perf_counter()
    doc = trafilatura.bare_extraction(html, url=url, with_metadata=True, include_comments=False,
                                      include_tables=False, favor_precision=True)
    title, text = "", ""
    if doc is not None:
        title = (getattr(doc, "title", None) or "").strip()
        text = (getattr(doc, "text", None) or "").strip()
    return Extracted(title, text, time.perf_counter() - start)


async def extract_async(executor: Executor, html: str, url: str) -> Extracted:
    return await asyncio.get_running_loop().run_in_executor(executor, extract_main_text, html, url)
