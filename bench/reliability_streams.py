"""A streaming-input session of `bench.reliability`: the client retrieves itself and streams its
chunks through `/v1/streams` (open, chunks with `seq`, finish), as a client of the API would, retrying
what a fault cut.

- a chunk cut by a fault (transport error, 5xx, 409 "being applied" while its claimer's death is not
  yet known) is sent again with the same `seq`: exactly once on the replica, whichever ingress takes it;
- an answer cut after its first event resumes with `Last-Event-ID`; one cut before any answer event
  resumes from token 0 at the replica the session record names (`GET /v1/streams/{id}`), since the
  record is marked finished and a second finish is refused (409);
- a finish refused by Serve's proxy with no ingress answering (5xx) is sent again; when the ingress
  it reached had marked the record finished before dying, that is refused (409), and the answer is
  resumed from token 0 as above (seen at 5fedc12: the one `failed` of bench/results/reliability_scale.json).

The result is a `RagResult`, so the summary treats both kinds of session alike; `contexts` counts
the chunks accepted. Only `SessionGone` (the record and the replica both lost it) leaves the user
asking again (`must_ask_again`).
"""

from __future__ import annotations

import asyncio
import time

import httpx

from pipeline.ingress.http_util import INGRESS_HEADER
from pipeline.run.rag_client import RagResult, error_reason, read_events
from stream2llm.data.traces import PromptMode

CHUNK_TRIES, RETRY_S = 12, 0.5
ANSWER_TRIES = 4
OPEN_STREAMS: set[str] = set()  # sessions open now (the shard-kill drill aims at the shard holding most)


async def _post(http: httpx.AsyncClient, url: str, body: dict, result: RagResult) -> httpx.Response | None:
    try:
        r = await http.post(url, json=body)
    except httpx.HTTPError as e:
        result.error = f"{type(e).__name__}: {e}"
        return None
    result.ingresses.append(r.headers.get(INGRESS_HEADER, ""))
    return r


def _again(r: httpx.Response | None) -> bool:
    """A cut call, a 5xx, or a claim still held by an ingress whose death is not yet known."""
    return r is None or r.status_code >= 500 or r.status_code == 409


async def stream_session(http: httpx.AsyncClient, base: str, question: str, chunks: list[str], gap_s: float,
                         max_tokens: int) -> RagResult:
    result = RagResult(question, PromptMode.STREAM, sent_at=time.monotonic())
    try:
        sid = await _open(http, base, result)
        if sid is None:
            return result
        OPEN_STREAMS.add(sid)
        for seq, text in enumerate(chunks):
            if seq:
                await asyncio.sleep(gap_s)
            if not await _chunk(http, base, sid, seq, text, result):
                return result
        result.retrieval_done_at = time.monotonic()
        await _answer(http, base, sid, question, max_tokens, result)
    finally:
        result.done_at = time.monotonic()
        OPEN_STREAMS.discard(result.session_id)
    return result


async def _open(http: httpx.AsyncClient, base: str, result: RagResult) -> str | None:
    for _ in range(CHUNK_TRIES):
        r = await _post(http, f"{base}/v1/streams", {"source_type": "client"}, result)
        if r is not None and r.status_code == 201:
            result.status, result.error = 201, None
            result.session_id = r.json()["session_id"]
            return result.session_id
        if r is not None and not _again(r):
            result.status, result.error = r.status_code, error_reason(r)
            return None
        await asyncio.sleep(RETRY_S)
    result.status = 0 if r is None else r.status_code
    return None


async def _chunk(http: httpx.AsyncClient, base: str, sid: str, seq: int, text: str, result: RagResult) -> bool:
    body = {"text": text, "source_id": f"{sid[:6]}-{seq}", "seq": seq}
    for _ in range(CHUNK_TRIES):
        r = await _post(http, f"{base}/v1/streams/{sid}/chunks", body, result)
        if r is not None and r.status_code == 200:
            result.error = None
            result.contexts += 1
            return True
        if r is not None and not _again(r):
            result.status, result.error = r.status_code, error_reason(r)
            return False
        if r is not None:
            result.error = error_reason(r)
        await asyncio.sleep(RETRY_S)
    result.status = 0 if r is None else r.status_code
    return False


async def _answer(http: httpx.AsyncClient, base: str, sid: str, question: str, max_tokens: int,
                  result: RagResult) -> None:
    body = {"question": question, "sampling": {"max_tokens": max_tokens, "temperature": 0.0}}
    headers: dict = {}
    for attempt in range(ANSWER_TRIES):
        cut = await read_events(http, f"{base}/v1/streams/{sid}/finish", body, headers, result)
        finished_before = attempt > 0 and not headers and result.status == 409  # by an ingress that died
        if not cut and not finished_before:
            return
        if not finished_before and result.status >= 500 and result.ingresses[-1:] == [""] and not headers:
            continue  # refused by the proxy: no ingress took the finish, send it again
        last = result.last_event_id or await _answer_start(http, base, sid)
        if last is None:
            return
        result.resumed += 1
        result.error = None
        headers = {"Last-Event-ID": last}
        await asyncio.sleep(RETRY_S * (attempt + 1))


async def _answer_start(http: httpx.AsyncClient, base: str, sid: str) -> str | None:
    """The id before the answer's first token, at the replica the session's record names."""
    try:
        r = await http.get(f"{base}/v1/streams/{sid}")
    except httpx.HTTPError:
        return None
    return f"{sid}.{r.json()['replica_id']}.0" if r.status_code == 200 else None
