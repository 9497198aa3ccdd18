"""Fault routes of the local site, one per failure the crawler must survive."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from aiohttp import web

from stream2llm.data.corpus import Document
from .site_pages import article_page, boilerplate_only_page

BAD_CHARSET_TEXT = "Café society and naïve façades: a page sent in cp1252 under a bogus charset label. " * 3


def add_fault_routes(app: web.Application, config, docs: Sequence[Document]) -> None:
    first = docs[0]

    async def not_found(_r):
        raise web.HTTPNotFound(text="gone")

    async def server_error(_r):
        raise web.HTTPInternalServerError(text="boom")

    async def slow(_r):
        await asyncio.sleep(config.slow_page_s)
        return web.Response(text=article_page(first, ()), content_type="text/html")

    async def huge(request):
        response = web.StreamResponse(headers={"Content-Type": "text/html"})  # no Content-Length
        await response.prepare(request)
        block = b"<p>" + b"x" * 65_530 + b"</p>\n"
        for _ in range(config.huge_page_bytes // len(block) + 1):
            await response.write(block)
        await response.write_eof()
        return response

    async def binary(_r):
        return web.Response(body=bytes(range(256)) * 64, content_type="application/octet-stream")

    async def loop_a(_r):
        raise web.HTTPFound("/fault/loop-b")

    async def loop_b(_r):
        raise web.HTTPFound("/fault/loop-a")

    async def redirect(request):
        target = request.query.get("to")
        if not target:
            raise web.HTTPBadRequest(text="missing ?to=")
        raise web.HTTPFound(target)

    async def bad_charset(_r):
        body = f"<html><body><article><h1>Charset</h1><p>{BAD_CHARSET_TEXT}</p></article></body></html>"
        return web.Response(body=body.encode("cp1252"),
                            headers={"Content-Type": "text/html; charset=x-bogus-charset"})

    async def duplicate(_r):
        return web.Response(text=article_page(first, docs[1:3]), content_type="text/html")

    async def private(_r):
        return web.Response(text=article_page(first, ()), content_type="text/html")

    async def empty(_r):
        return web.Response(text=boilerplate_only_page(), content_type="text/html")

    routes = {
        "/fault/404": not_found, "/fault/500": server_error, "/fault/slow": slow, "/fault/huge": huge,
        "/fault/binary": binary, "/fault/loop-a": loop_a, "/fault/loop-b": loop_b,
        "/fault/redirect": redirect, "/fault/bad-charset": bad_charset, "/fault/duplicate": duplicate,
        "/fault/empty": empty, "/private/secret": private,
    }
    for path, handler in routes.items():
        app.router.add_get(path, handler)
