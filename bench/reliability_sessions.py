"""One session of `bench.reliability`: a /v1/rag ask (`pipeline.run.rag_client.ask`), a
streaming-input session (`bench.reliability_streams`), or a client that leaves on purpose at its
first `context` event (mid-retrieval) or first `token` (mid-answer); and how its outcome is classed.

A client whose stream is cut after the answer began reconnects with Last-Event-ID (the rest of the
answer, nothing run again: `resumed`); one cut before any answer event, refused by Serve's proxy
with no ingress answering (5xx), or whose resume is answered `SessionGone` (the answer's replica
died too) asks again once, as a user would (`reasked`: retrieval and generation run again). Either
is counted; neither hides a loss: a session is lost only when no attempt brought a final event. A client planned to leave that is
refused with 429 asks again (up to `LEAVER_ASKS` times): the drill is its disconnect.
"""

from __future__ import annotations

import asyncio
import time

import httpx

from bench.http_replay import relative_timings
from bench.reliability_streams import stream_session
from pipeline.errors import SessionGone
from pipeline.ingress.http_util import INGRESS_HEADER
from pipeline.run.rag_client import RESUME_BACKOFF_S, RagResult, apply_event, ask, error_reason, sse_events
from stream2llm.data.traces import PromptMode

RESUME_ATTEMPTS = 3
LEAVER_ASKS, LEAVER_RETRY_S = 3, 2.0  # a planned leaver refused with 429 asks up to 3 times, 2 s apart


# ---- one session ------------------------------------------------------------------------------
async def ask_and_leave(http: httpx.AsyncClient, base: str, question: str, source: dict, leave_on: str,
                        max_tokens: int) -> tuple[RagResult, bool]:
    """Like `ask`, but the client closes the connection at the first `leave_on` event; a stream cut
    before it (a fault) is resumed with Last-Event-ID, as `ask` does. Returns the result and whether
    it left (False: the answer or an error came first)."""
    body = {"question": question, "source": source, "sampling": {"max_tokens": max_tokens, "temperature": 0.0}}
    result = RagResult(question, PromptMode.STREAM, sent_at=time.monotonic())
    headers: dict = {}
    try:
        for _ in range(RESUME_ATTEMPTS + 1):
            left, cut = await _read_until(http, f"{base}/v1/rag", body, headers, result, leave_on)
            if left or not cut or result.last_event_id is None:
                return result, left
            result.resumed += 1
            result.taken_over += result.last_event_id.rsplit(".", 1)[-1].startswith("c")
            result.error, headers = None, {"Last-Event-ID": result.last_event_id}
            await asyncio.sleep(RESUME_BACKOFF_S * result.resumed)
    finally:
        result.done_at = time.monotonic()
    return result, False


async def _read_until(http: httpx.AsyncClient, url: str, body: dict, headers: dict, result: RagResult,
                      leave_on: str) -> tuple[bool, bool]:
    """(left at `leave_on`, cut: a transport error, a 5xx or a stream ended with no final event)."""
    try:
        async with http.stream("POST", url, json=body, headers=headers) as response:
            result.status = response.status_code
            result.ingresses.append(response.headers.get(INGRESS_HEADER, ""))
            if response.status_code != 200:
                await response.aread()
                result.error = error_reason(response)
                return False, response.status_code >= 500
            async for name, data, event_id in sse_events(response):
                apply_event(result, name, data, event_id)
                if event_id:
                    result.last_event_id = event_id
                if name == leave_on:
                    return True, False  # leaving the block closes the connection
    except httpx.HTTPError as e:
        result.error = f"{type(e).__name__}: {e}"
        return False, True
    return False, result.error is None and not result.final


def outcome(result: RagResult, left: bool, timed_out: bool = False) -> str:
    """answered | rejected (429) | disconnected (left on purpose) | lost (no final event and no
    error reported: a cut stream, a transport error or the client's timeout) | failed (an error
    response or error event). The five are disjoint."""
    if left:
        return "disconnected"
    if result.ok:
        return "answered"
    if timed_out or is_lost(result):
        return "lost"
    return "rejected" if result.status == 429 else "failed"


def is_lost(result: RagResult) -> bool:
    """No final event and no error response: the stream was cut, or nothing came in time."""
    if result.final or result.status not in (0, 200):
        return False
    transport = getattr(httpx, _error_kind(result), None)
    cut = (result.error or "").startswith("the stream ended without")
    return cut or (isinstance(transport, type) and issubclass(transport, httpx.HTTPError))


def _error_kind(result: RagResult) -> str:
    """The error's type name: `RagResult.error` reads "<kind>: <reason>"."""
    return (result.error or "").split(":", 1)[0]


def must_ask_again(result: RagResult) -> bool:
    """What a user does next: ask again when no attempt can continue the answer. The request was cut
    before any answer event (a lost stream), or refused by Serve's proxy (a 5xx with no ingress id:
    no ingress answered it, e.g. the one it went to died), or its answer was lost: a resume was
    answered `SessionGone` (a 404, or an error event when the replica died during the resume)
    because the replica holding the answer died as well as the ingress that drove the session,
    the only process that held its context."""
    if result.final:
        return False
    if result.resumed > 0 and _error_kind(result) == SessionGone.__name__:
        return True
    if result.last_event_id is not None:
        return False
    refused_by_proxy = result.status >= 500 and not (result.ingresses and result.ingresses[-1])
    return is_lost(result) or refused_by_proxy


async def _attempt(http: httpx.AsyncClient, base: str, plan) -> tuple[RagResult, bool]:
    if plan.kind == "streams":
        return await stream_session(http, base, plan.question, plan.source["chunks"], plan.source["gap_s"],
                                    plan.max_tokens), False
    if plan.leave_on is not None:
        return await ask_and_leave(http, base, plan.question, plan.source, plan.leave_on, plan.max_tokens)
    return await ask(http, base, plan.question, plan.source, max_tokens=plan.max_tokens,
                     resume_attempts=RESUME_ATTEMPTS), False


async def _one(http: httpx.AsyncClient, base: str, plan) -> tuple[RagResult, bool, RagResult | None]:
    """The result, whether the client left on purpose, and the first attempt when it asked again."""
    result, left = await _attempt(http, base, plan)
    first_sent, asks = result.sent_at, 1
    while plan.leave_on is not None and result.status == 429 and asks < LEAVER_ASKS:
        # a leaver exists to drive the disconnect path: refused under load, it asks again later
        await asyncio.sleep(LEAVER_RETRY_S)
        result, left = await _attempt(http, base, plan)
        result.sent_at, asks = first_sent, asks + 1
    if left or not must_ask_again(result):
        return result, left, None
    again, left = await _attempt(http, base, plan)
    again.sent_at = result.sent_at  # the user's wait counts from the first attempt
    return again, left, result


async def send_session(http: httpx.AsyncClient, base: str, plan, t0: float, timeout_s: float) -> dict:
    """One planned session at its arrival time; given up (and counted lost) after `timeout_s`."""
    await asyncio.sleep(max(0.0, t0 + plan.at_s - time.monotonic()))
    sent = time.monotonic()
    try:
        result, left, first = await asyncio.wait_for(_one(http, base, plan), timeout_s)
        timed_out = False
    except asyncio.TimeoutError:
        result = RagResult(plan.question, PromptMode.STREAM, sent_at=sent, done_at=time.monotonic())
        left, timed_out, first = False, True, None
        result.error = f"no final event within {timeout_s:.0f} s"
    return {"index": plan.index, "kind": plan.kind, "leave_on": plan.leave_on, "at_s": round(plan.at_s, 3),
            "sent_s": round(result.sent_at - t0, 3), "latency_s": result.latency_s, "ttft_s": result.ttft_s,
            "status": result.status, "outcome": outcome(result, left, timed_out), "ok": result.ok and not left,
            **relative_timings(result),
            "error": result.error, "retrieval_done": result.retrieval_done_at is not None,
            "answered_tokens": bool(result.first_token_at), "recovered": bool(result.final.get("recovered")),
            "replica_id": result.final.get("replica_id"), "contexts": result.contexts, "skipped": result.skipped,
            "resumed": result.resumed, "took_over": result.taken_over, "retried": result.retried,
            "reasked": first is not None,
            "cut_error": None if first is None else first.error,
            "cut_had_id": bool(first is not None and first.session_id),
            "ingresses": (first.ingresses if first else []) + result.ingresses,
            "session_id": result.session_id or (first.session_id if first else None),
            "session_ids": [x.session_id for x in (first, result) if x is not None and x.session_id]}
