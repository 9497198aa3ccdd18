"""HTTP plumbing shared by the routes: SSE framing, error responses, body limits, auth."""

from __future__ import annotations

import hmac
import json
import logging

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.middleware.base import BaseHTTPMiddleware

from pipeline.errors import AdmissionRejected, error_body, http_status, unwrap

log = logging.getLogger("stream2llm.http")

PUBLIC_PATHS = {"/healthz", "/metrics"}


def sse(event: str, data) -> str:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def error_response(error: BaseException) -> JSONResponse:
    status = http_status(error)
    if status >= 500:
        log.exception("internal error", exc_info=unwrap(error))
    headers = {}
    cause = unwrap(error)
    if isinstance(cause, AdmissionRejected):
        headers["Retry-After"] = str(cause.retry_after_s)
    return JSONResponse(error_body(error), status_code=status, headers=headers)


def validation_response(_: Request, exc: RequestValidationError) -> JSONResponse:
    problems = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors()]
    malformed = any(e.get("type") == "json_invalid" for e in exc.errors())
    return JSONResponse({"error": "MalformedJSON" if malformed else "ValidationError",
                         "reason": "; ".join(problems)}, status_code=400 if malformed else 422)


def event_stream(events) -> StreamingResponse:
    """SSE response; errors after the stream started become an `error` event."""

    async def body():
        try:
            async for name, data in events:
                yield sse(name, data)
        except Exception as e:  # the status line is gone: report in-band
            yield sse("error", {**error_body(e), "status": http_status(e)})
        finally:
            await events.aclose()

    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def first_then_rest(events):
    """Run a generator to its first item so setup errors (429, 404) still get a status code."""
    first = await events.__anext__()

    async def chained():
        try:
            yield first
            async for item in events:
                yield item
        finally:
            await events.aclose()

    return chained()


class LimitsMiddleware(BaseHTTPMiddleware):
    """Body size limit and optional bearer-token auth, before any route runs.

    Added to the FastAPI app at import time (Serve pickles the app into the ingress replica before
    the ingress constructor runs), so the constructor hands the settings over with `configure`.
    """

    max_bytes: int = 1 << 20
    tokens: list[bytes] = []

    @classmethod
    def configure(cls, max_bytes: int, tokens: list[str]) -> None:
        cls.max_bytes = max_bytes
        cls.tokens = [t.encode() for t in tokens]

    async def dispatch(self, request: Request, call_next):
        if self.tokens and request.url.path not in PUBLIC_PATHS and not self._authorized(request):
            return JSONResponse({"error": "Unauthorized", "reason": "missing or wrong bearer token"},
                                status_code=401, headers={"WWW-Authenticate": "Bearer"})
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            return JSONResponse({"error": "RequestTooLarge",
                                 "reason": f"body of {length} bytes exceeds {self.max_bytes}"}, 413)
        if request.method in ("POST", "PUT") and length is None:
            body = await request.body()
            if len(body) > self.max_bytes:
                return JSONResponse({"error": "RequestTooLarge",
                                     "reason": f"body exceeds {self.max_bytes} bytes"}, 413)
        return await call_next(request)

    def _authorized(self, request: Request) -> bool:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        return any(hmac.compare_digest(token.encode(), t) for t in self.tokens)
