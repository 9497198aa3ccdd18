"""Fetch one page under the crawler's limits: manual redirects (each hop checked), size cap,
content-type allowlist, charset decoding."""

from __future__ import annotations

import asyncio
import codecs
import re
from dataclasses import dataclass
from urllib.parse import urljoin

import aiohttp

from .crawler_config import CrawlerConfig
from .netguard import Allowlist, UnsafeURLError, check_url
from .robots import RobotsUnavailableError

_META_CHARSET = re.compile(rb"""<meta[^>]+charset=["']?([A-Za-z0-9_\-]+)""", re.I)
REDIRECT_CODES = (301, 302, 303, 307, 308)


class FetchError(Exception):
    """A page could not be fetched; ``reason`` is short and safe to show."""

    def __init__(self, url: str, reason: str):
        super().__init__(f"{url}: {reason}")
        self.url = url
        self.reason = reason


@dataclass(frozen=True)
class Page:
    url: str          # the URL asked for
    final_url: str    # after redirects
    content_type: str
    text: str         # decoded body
    charset: str


def make_session(config: CrawlerConfig, resolver) -> aiohttp.ClientSession:
    """A session whose connector resolves only through the SSRF-checking resolver."""
    connector = aiohttp.TCPConnector(resolver=resolver, limit=config.concurrency,
                                     limit_per_host=config.per_host_concurrency)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=config.connect_timeout_s,
                                    sock_read=config.read_timeout_s)
    return aiohttp.ClientSession(connector=connector, timeout=timeout, trust_env=False,
                                 headers={"User-Agent": config.user_agent})


async def fetch_page(session: aiohttp.ClientSession, url: str, config: CrawlerConfig,
                     allowlist: Allowlist, may_fetch=None) -> Page:
    """GET ``url``; ``may_fetch(url)`` (robots) is awaited on every hop when given."""
    try:
        return await asyncio.wait_for(_follow(session, url, config, allowlist, may_fetch),
                                      config.page_timeout_s)
    except asyncio.TimeoutError as exc:
        raise FetchError(url, f"timed out after {config.page_timeout_s:g} s") from exc


async def _follow(session, url, config, allowlist, may_fetch) -> Page:
    seen = set()
    current = url
    for _ in range(config.max_redirects + 1):
        if current in seen:
            raise FetchError(url, f"redirect loop at {current}")
        seen.add(current)
        _check(current, allowlist, url)
        if may_fetch is not None and not await _robots_allow(may_fetch, current, url):
            raise FetchError(url, f"disallowed by robots.txt: {current}")
        location = await _get_once(session, url, current, config)
        if isinstance(location, Page):
            return location
        current = location
    raise FetchError(url, f"more than {config.max_redirects} redirects")


async def _robots_allow(may_fetch, current: str, url: str) -> bool:
    try:
        return await may_fetch(current)
    except (UnsafeURLError, RobotsUnavailableError) as exc:
        raise FetchError(url, str(exc)) from exc


def _check(current: str, allowlist: Allowlist, url: str) -> None:
    try:
        check_url(current, allowlist)
    except UnsafeURLError as exc:
        raise FetchError(url, str(exc)) from exc


async def _get_once(session, url: str, current: str, config: CrawlerConfig) -> Page | str:
    """One hop: a Page, or the next URL when the answer is a redirect."""
    try:
        async with session.get(current, allow_redirects=False) as response:
            if response.status in REDIRECT_CODES:
                location = response.headers.get("Location")
                if not location:
                    raise FetchError(url, f"HTTP {response.status} without Location")
                return urljoin(current, location)
            if response.status >= 400:
                raise FetchError(url, f"HTTP {response.status}")
            content_type = response.content_type or ""
            if content_type not in config.content_types:
                raise FetchError(url, f"content type {content_type!r} not allowed")
            body = await _read_capped(response, url, config.max_page_bytes)
            text, charset = decode_body(body, response.charset)
            return Page(url, current, content_type, text, charset)
    except aiohttp.ClientConnectorError as exc:
        cause = exc.os_error if isinstance(exc.os_error, UnsafeURLError) else None
        raise FetchError(url, str(cause) if cause else f"connect failed: {exc.os_error}") from exc
    except aiohttp.ClientError as exc:
        raise FetchError(url, f"{type(exc).__name__}: {exc}") from exc
    except asyncio.TimeoutError as exc:  # sock_connect / sock_read
        raise FetchError(url, "connect/read timeout") from exc


async def _read_capped(response: aiohttp.ClientResponse, url: str, limit: int) -> bytes:
    declared = response.content_length
    if declared is not None and declared > limit:
        raise FetchError(url, f"page of {declared} bytes exceeds max_page_bytes={limit}")
    parts, size = [], 0
    async for block in response.content.iter_chunked(64 * 1024):
        size += len(block)
        if size > limit:
            raise FetchError(url, f"page exceeds max_page_bytes={limit}")
        parts.append(block)
    return b"".join(parts)


def decode_body(body: bytes, declared: str | None) -> tuple[str, str]:
    """Decode with the declared charset, else a <meta> charset, else UTF-8, else cp1252.

    An unknown charset name falls through to the next candidate; bytes invalid in UTF-8 fall back
    to cp1252 (the usual mislabelled page), which never fails on the 5 undefined bytes thanks to
    ``errors="replace"``.
    """
    meta = _META_CHARSET.search(body[:4096])
    candidates = [declared, meta.group(1).decode("ascii") if meta else None, "utf-8"]
    for name in candidates:
        if not name or not _known(name):
            continue
        try:
            return body.decode(name), codecs.lookup(name).name
        except UnicodeDecodeError:
            continue
    return body.decode("cp1252", errors="replace"), "cp1252"


def _known(name: str) -> bool:
    try:
        codecs.lookup(name)
        return True
    except LookupError:
        return False
