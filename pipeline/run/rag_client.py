"""A client of `/v1/rag` that times what a user sees: SSE events parsed as they arrive.

    async with httpx.AsyncClient(timeout=None) as http:
        result = await ask(http, base_url, "What is the capital of Peru?", {"type": "vector"})
        result.answer, result.citations, result.ttft_s

`ttft_s` is the paper's TTFT measured at the client: from the `retrieval_done` event (the last
context piece is in) to the first answer token, both received over HTTP. `engine_ttft_s` is the
engine's own figure for the same request (from handing over the question to its first token).

With `resume_attempts`, a cut stream (its ingress died, a proxy dropped the connection) is picked up
again with `Last-Event-ID`, the id of the last event received. After the answer began, the ingress
that takes the reconnect serves the rest of the answer from its replica; before it (the `session`
event, a context event), it takes the session over: the retrieval went on on the replica, and the
reconnect gets the context events it missed, then the answer (`resumed` counts both, `taken_over`
the second). Nothing runs twice. A request cut before any event (no ingress answered it) is sent
again (`retried`): nothing of it had reached the client. An answer whose replica died too cannot be resumed:
the reconnect is answered `SessionGone` (404), and the caller may ask again.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import httpx

from pipeline.ingress.http_util import INGRESS_HEADER
from stream2llm.data.traces import PromptMode

ANSWER_EVENTS = ("token", "final")
RESUME_BACKOFF_S = 0.5  # times the attempt number: a reconnect may meet the dead ingress once more


@dataclass
class RagResult:
    question: str
    prompt_mode: PromptMode
    status: int = 0
    error: str | None = None
    answer: str = ""
    final: dict = field(default_factory=dict)
    contexts: int = 0
    skipped: int = 0
    source_errors: int = 0
    sent_at: float = 0.0
    retrieval_done_at: float | None = None
    first_token_at: float | None = None
    done_at: float | None = None
    token_times: list[float] = field(default_factory=list)  # arrival of each token event (serving metrics' ITL)
    last_event_id: str | None = None  # of the last answer event received: where a resume starts
    resumed: int = 0                  # reconnects made with Last-Event-ID
    taken_over: int = 0               # ... of them from an event before the answer (a context event's id)
    retried: int = 0                  # requests sent again that no ingress had answered (nothing started)
    ingresses: list[str] = field(default_factory=list)  # ingress replica of each response, in order
    session_id: str | None = None     # from the first event id (ids start with the session's)

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None and bool(self.final)

    @property
    def ttft_s(self) -> float | None:
        if self.first_token_at is None or self.retrieval_done_at is None:
            return None
        return self.first_token_at - self.retrieval_done_at

    @property
    def engine_ttft_s(self) -> float | None:
        return self.final.get("ttft_s")

    @property
    def citations(self) -> list[dict]:
        return self.final.get("citations", [])

    @property
    def latency_s(self) -> float | None:
        return None if self.done_at is None else self.done_at - self.sent_at

    def summary(self) -> dict:
        """A flat record for JSON/CSV output."""
        return {"question": self.question, "prompt_mode": self.prompt_mode, "status": self.status,
                "ok": self.ok, "error": self.error, "answer": self.answer, "ttft_s": self.ttft_s,
                "engine_ttft_s": self.engine_ttft_s, "latency_s": self.latency_s,
                "retrieval_s": self.final.get("retrieval_s"), "contexts": self.contexts,
                "context_tokens": self.final.get("context_tokens"),
                "tokens_prefilled_before_finish": self.final.get("tokens_prefilled_before_finish"),
                "tokens_invalidated": self.final.get("tokens_invalidated"),
                "replica_id": self.final.get("replica_id"), "sent_at": self.sent_at,
                "citations": [c.get("source_id") for c in self.citations]}


async def ask(http: httpx.AsyncClient, base_url: str, question: str, source: dict, *,
              prompt_mode: PromptMode = PromptMode.STREAM, max_tokens: int = 32,
              headers: dict | None = None, resume_attempts: int = 0) -> RagResult:
    """POST /v1/rag and read its event stream; HTTP errors come back in the result, not raised.
    A stream cut after the answer began is resumed up to `resume_attempts` times (module doc)."""
    body = {"question": question, "source": source, "prompt_mode": prompt_mode,
            "sampling": {"max_tokens": max_tokens, "temperature": 0.0}}
    result = RagResult(question, prompt_mode, sent_at=time.monotonic())
    try:
        cut = await read_events(http, f"{base_url}/v1/rag", body, headers, result)
        while cut and result.resumed + result.retried < resume_attempts:
            if result.last_event_id is None and not _unstarted(result):
                break
            again = dict(headers or {})
            if result.last_event_id is None:
                result.retried += 1
            else:
                result.resumed += 1
                result.taken_over += result.last_event_id.rsplit(".", 1)[-1].startswith("c")
                again["Last-Event-ID"] = result.last_event_id
            await asyncio.sleep(RESUME_BACKOFF_S * (result.resumed + result.retried))
            result.error = None
            cut = await read_events(http, f"{base_url}/v1/rag", body, again, result)
    finally:
        result.done_at = time.monotonic()
    return result


def _unstarted(result: RagResult) -> bool:
    """No event came and no ingress answered (a transport error, or Serve's proxy answered 5xx for
    an ingress that died): nothing reached the client, and a session the dead ingress may have
    opened is freed by its replica (owner check), so sending the request again is safe."""
    return result.session_id is None and (result.status == 0 or not (result.ingresses and result.ingresses[-1]))


async def read_events(http: httpx.AsyncClient, url: str, body: dict, headers: dict | None, result: RagResult) -> bool:
    """One POST and its events into `result`; a cut or failed stream leaves `error` set. True when
    trying again may help: the stream was cut (a transport error, or it ended with neither a final
    nor an error event) or a server-side 5xx; an error event or a 4xx is the answer."""
    try:
        async with http.stream("POST", url, json=body, headers=headers) as response:
            result.status = response.status_code
            result.ingresses.append(response.headers.get(INGRESS_HEADER, ""))
            if response.status_code != 200:
                await response.aread()
                result.error = error_reason(response)
                return response.status_code >= 500
            async for name, data, event_id in sse_events(response):
                apply_event(result, name, data, event_id)
                if event_id:  # where a reconnect starts (before the answer: a take-over)
                    result.last_event_id = event_id
    except httpx.HTTPError as e:
        result.error = f"{type(e).__name__}: {e}"
        return True
    if result.error is None and not result.final:
        result.error = "the stream ended without a final event"
        return True
    return False


def apply_event(result: RagResult, name: str, data: dict, event_id: str | None = None) -> None:
    now = time.monotonic()
    if event_id and result.session_id is None:
        result.session_id = event_id.split(".", 1)[0]
    if name == "context":
        result.contexts += 1
    elif name == "context_skipped":
        result.skipped += 1
    elif name == "source_error":
        result.source_errors += 1
    elif name == "retrieval_done":
        result.retrieval_done_at = now
    elif name == "token":
        if result.first_token_at is None and data.get("token_ids"):
            result.first_token_at = now
        if data.get("token_ids"):
            result.token_times.append(now)
        result.answer += data.get("text", "")
    elif name == "final":
        result.final = data
    elif name == "error":
        result.error = f"{data.get('error')}: {data.get('reason')}"


async def sse_events(response: httpx.Response):
    """(name, data, id) of each event; id is None when the event has none."""
    name, data, event_id = None, None, None
    async for line in response.aiter_lines():
        if line.startswith("id: "):
            event_id = line[len("id: "):]
        elif line.startswith("event: "):
            name = line[len("event: "):]
        elif line.startswith("data: "):
            data = json.loads(line[len("data: "):])
        elif not line and name is not None:
            yield name, data, event_id
            name, data, event_id = None, None, None
    if name is not None:
        yield name, data, event_id


def error_reason(response: httpx.Response) -> str:
    try:
        body = response.json()
        return f"{body.get('error')}: {body.get('reason')}"
    except ValueError:
        return response.text[:200]
