"""robots.txt, fetched once per origin per crawl through the same guarded session."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit
from urllib.robotparser import RobotFileParser

import aiohttp

from .netguard import Allowlist, UnsafeURLError, check_url

ROBOTS_MAX_BYTES = 256 * 1024


class RobotsUnavailableError(Exception):
    """robots.txt could not be read (5xx, redirect, network error): the origin is not crawled."""


class RobotsCache:
    """4xx (no robots.txt) allows everything; 5xx, a redirect or an unreachable origin disallows
    everything (the conservative reading of RFC 9309), and says why."""

    def __init__(self, session: aiohttp.ClientSession, user_agent: str, allowlist: Allowlist):
        self._session = session
        self._agent = user_agent
        self._allowlist = allowlist
        self._parsers: dict[str, asyncio.Task] = {}

    async def allowed(self, url: str) -> bool:
        """True/False from the rules; raises UnsafeURLError or RobotsUnavailableError."""
        parts = urlsplit(url)
        origin = f"{parts.scheme}://{parts.netloc}"
        task = self._parsers.get(origin)
        if task is None:
            task = asyncio.ensure_future(self._load(origin))
            self._parsers[origin] = task
        parser = await asyncio.shield(task)
        if isinstance(parser, Exception):
            raise parser
        return parser.can_fetch(self._agent, url)

    async def _load(self, origin: str) -> RobotFileParser | Exception:
        parser = RobotFileParser()
        try:
            check_url(origin + "/robots.txt", self._allowlist)
            async with self._session.get(origin + "/robots.txt", allow_redirects=False) as response:
                if 400 <= response.status < 500:
                    parser.allow_all = True
                    return parser
                if response.status >= 300:
                    return RobotsUnavailableError(f"robots.txt answered HTTP {response.status}")
                body = await response.content.read(ROBOTS_MAX_BYTES)
                parser.parse(body.decode("utf-8", errors="replace").splitlines())
                return parser
        except UnsafeURLError as exc:
            return exc
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.os_error, UnsafeURLError):
                return exc.os_error
            return RobotsUnavailableError(f"robots.txt unreachable: {exc.os_error}")
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            return RobotsUnavailableError(f"robots.txt unreachable: {type(exc).__name__}")

    def close(self) -> None:
        for task in self._parsers.values():
            task.cancel()
