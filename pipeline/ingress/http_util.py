"""HTTP plumbing shared by the routes: SSE framing, error responses, body limits, auth."""

from __future__ import annotations

import hmac
import json
import logging

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.datastructures import Headers

from pipeline.errors import error_body, http_status, is_openai_path, openai_error, openai_error_body, unwrap

log = logging.getLogger("stream2llm.http")

PUBLIC_PATHS = {"/healthz", "/metrics"}
INGRESS_HEADER = "x-stream2llm-ingress"


def sse(event: str, data, event_id: str | None = None) -> str:
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def error_response(error: BaseException, openai: bool = False) -> JSONResponse:
    """The one error shape: `{"error", "reason", ...}`, or OpenAI's error object on its routes."""
    status = http_status(error)
    if status >= 500:
        log.exception("internal error", exc_info=unwrap(error))
    headers = {}
    cause = unwrap(error)
    if getattr(cause, "retry_after_s", None) is not None:  # 429 admission refused, 503 not ready
        headers["Retry-After"] = str(cause.retry_after_s)
    body = openai_error(error) if openai else error_body(error)
    return JSONResponse(body, status_code=status, headers=headers)


def plain_error(path: str, status: int, kind: str, reason: str, headers: dict | None = None) -> JSONResponse:
    """An error found before any route ran (validation, size, auth, unknown path), shaped by path."""
    body = openai_error_body(status, kind, reason) if is_openai_path(path) else {"error": kind, "reason": reason}
    return JSONResponse(body, status_code=status, headers=headers)


def validation_response(request: Request, exc: RequestValidationError) -> JSONResponse:
    problems = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors()]
    malformed = any(e.get("type") == "json_invalid" for e in exc.errors())
    if is_openai_path(request.url.path):  # as `vllm serve` answers a body its request models refuse
        return plain_error(request.url.path, 400, "BadRequestError", "; ".join(problems))
    return plain_error(request.url.path, 400 if malformed else 422,
                       "MalformedJSON" if malformed else "ValidationError", "; ".join(problems))


def http_exception_response(request: Request, exc) -> JSONResponse:
    """Starlette's own errors (unknown path 404, wrong method 405) in the same shape."""
    kind = {404: "NotFound", 405: "MethodNotAllowed"}.get(exc.status_code, "HTTPError")
    return plain_error(request.url.path, exc.status_code, kind, str(exc.detail), getattr(exc, "headers", None))


class ClosingStreamingResponse(StreamingResponse):
    """A streaming response that closes its body generator when the call ends, a cut client included.

    Starlette abandons the body generator when the client disconnects (the send is cancelled where
    it waits), and Python closes an abandoned async generator only when it is garbage collected:
    with the reference cycles of a cancellation's traceback that can take minutes, and until then
    the generators' clean-up (aborting the session, releasing its admission) does not run.
    """

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()


def event_stream(events) -> StreamingResponse:
    """SSE response of (event, data[, id]) items; errors after the stream started become an
    `error` event."""

    async def body():
        try:
            async for name, data, *event_id in events:
                yield sse(name, data, event_id[0] if event_id else None)
        except Exception as e:  # the status line is gone: report in-band
            yield sse("error", {**error_body(e), "status": http_status(e)})
        finally:
            await events.aclose()

    return ClosingStreamingResponse(body(), media_type="text/event-stream",
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


class LimitsMiddleware:
    """Body size limit and optional bearer-token auth, before any route runs.

    Added to the FastAPI app at import time (Serve pickles the app into the ingress replica before
    the ingress constructor runs), so the constructor hands the settings over with `configure`.
    A plain ASGI middleware: Starlette's `BaseHTTPMiddleware` ran every request in a task of its own
    and passed every response piece through a memory stream, ~2 ms of the ingress's CPU per request
    on the 2-core machine (each OpenAI request's TTFT included).
    """

    max_bytes: int = 1 << 20
    tokens: list[bytes] = []
    ingress_id: str = ""

    def __init__(self, app):
        self.app = app

    @classmethod
    def configure(cls, max_bytes: int, tokens: list[str], ingress_id: str = "") -> None:
        cls.max_bytes = max_bytes
        cls.tokens = [t.encode() for t in tokens]
        cls.ingress_id = ingress_id

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.ingress_id:  # which ingress replica answered (operations, tests)
            send = _with_header(send, INGRESS_HEADER.encode(), self.ingress_id.encode())
        refusal, receive = await self._check(scope, receive)
        await (refusal or self.app)(scope, receive, send)

    async def _check(self, scope, receive):
        """(a refusal response or None, the receive the app reads the body from)."""
        path, headers = scope["path"], Headers(scope=scope)
        if self.tokens and path not in PUBLIC_PATHS and not self._authorized(headers):
            return plain_error(path, 401, "Unauthorized", "missing or wrong bearer token",
                               {"WWW-Authenticate": "Bearer"}), receive
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            return plain_error(path, 413, "RequestTooLarge", f"body of {length} bytes exceeds {self.max_bytes}"), receive
        if scope["method"] in ("POST", "PUT") and length is None:
            # Chunked body: read piece by piece and stop at the limit (never the whole body first);
            # the app then reads what was read, then the connection's own messages (a disconnect).
            parts, size = [], 0
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return None, _replay(b"".join(parts), receive, message)
                size += len(message.get("body", b""))
                if size > self.max_bytes:
                    return plain_error(path, 413, "RequestTooLarge", f"body exceeds {self.max_bytes} bytes"), receive
                parts.append(message.get("body", b""))
                if not message.get("more_body", False):
                    return None, _replay(b"".join(parts), receive)
        return None, receive

    def _authorized(self, headers: Headers) -> bool:
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        return any(hmac.compare_digest(token.encode(), t) for t in self.tokens)


def _with_header(send, name: bytes, value: bytes):
    async def tagged(message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), (name, value)]}
        await send(message)
    return tagged


def _replay(body: bytes, receive, ended=None):
    """A receive that gives `body` whole first, then `ended` (a disconnect read meanwhile) or the
    connection's own messages."""
    pending = [{"type": "http.request", "body": body, "more_body": False}, *([ended] if ended else [])]

    async def replayed():
        return pending.pop(0) if pending else await receive()
    return replayed
