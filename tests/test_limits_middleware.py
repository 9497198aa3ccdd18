"""The ingress's body limit and bearer-token auth (`LimitsMiddleware`, plain ASGI) on a small FastAPI
app: refusals before any route runs, the body the route reads, the ingress header on every answer.
The live app's HTTP tests (tests/test_pipeline_http.py) check the same through Ray Serve."""

import asyncio

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from pipeline.ingress.http_util import INGRESS_HEADER, LimitsMiddleware


@pytest.fixture
def app(monkeypatch):
    monkeypatch.setattr(LimitsMiddleware, "max_bytes", 64)
    monkeypatch.setattr(LimitsMiddleware, "tokens", [])
    monkeypatch.setattr(LimitsMiddleware, "ingress_id", "ing-1")
    api = FastAPI()
    api.add_middleware(LimitsMiddleware)

    @api.post("/echo")
    async def echo(request: Request):
        return {"bytes": len(await request.body())}

    @api.post("/stream")
    async def stream():
        return StreamingResponse((f"data: {i}\n\n" for i in range(3)), media_type="text/event-stream")

    @api.get("/healthz")
    async def healthz():
        return {"ok": True}
    return api


def call(app, method: str, path: str, **kw) -> httpx.Response:
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            return await c.request(method, path, **kw)
    return asyncio.run(go())


def chunked(*parts: bytes):
    async def body():
        for part in parts:
            yield part
    return body()


def test_bodies_within_the_limit_reach_the_route_whole_and_answers_carry_the_ingress(app):
    r = call(app, "POST", "/echo", content=b"x" * 64)
    assert r.status_code == 200 and r.json() == {"bytes": 64} and r.headers[INGRESS_HEADER] == "ing-1"
    r = call(app, "POST", "/echo", content=chunked(b"x" * 30, b"y" * 30))  # no content-length
    assert r.status_code == 200 and r.json() == {"bytes": 60}
    r = call(app, "POST", "/stream")
    assert r.text == "data: 0\n\ndata: 1\n\ndata: 2\n\n" and r.headers[INGRESS_HEADER] == "ing-1"


def test_bodies_over_the_limit_are_refused_with_413(app):
    r = call(app, "POST", "/echo", content=b"x" * 65)
    assert r.status_code == 413 and r.json()["error"] == "RequestTooLarge" and r.headers[INGRESS_HEADER] == "ing-1"
    r = call(app, "POST", "/echo", content=chunked(b"x" * 40, b"y" * 40))
    assert r.status_code == 413 and "exceeds 64 bytes" in r.json()["reason"]
    r = call(app, "POST", "/echo", content=b"{}", headers={"content-length": "many"})
    assert r.status_code == 413


def test_bearer_tokens_guard_every_path_but_the_public_ones(app, monkeypatch):
    monkeypatch.setattr(LimitsMiddleware, "tokens", [b"secret"])
    r = call(app, "POST", "/echo", content=b"{}")
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert call(app, "POST", "/echo", content=b"{}", headers={"authorization": "Bearer wrong"}).status_code == 401
    assert call(app, "POST", "/echo", content=b"{}", headers={"authorization": "Bearer secret"}).json() == {"bytes": 2}
    assert call(app, "GET", "/healthz").status_code == 200
