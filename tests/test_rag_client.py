"""`pipeline.run.rag_client.ask` resumes a cut stream with Last-Event-ID (an answer, or a session
taken over before its answer) and sends again a request no ingress answered.

The HTTP side is an `httpx.MockTransport` standing in for the ingress: these tests check the
client's decisions (when to reconnect, with which id, what it keeps). The real reconnect through a
killed ingress is exercised by tests/test_pipeline_ingress.py and `bench.reliability`'s ingress drill.
"""

import json

import httpx
import pytest

from pipeline.run import rag_client
from pipeline.ingress.http_util import INGRESS_HEADER, sse
from pipeline.run.rag_client import ask

FINAL = {"citations": [], "replica_id": "r1"}


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch):
    monkeypatch.setattr(rag_client, "RESUME_BACKOFF_S", 0.0)


class CutStream(httpx.AsyncByteStream):
    """Yields its events, then fails like a connection the server side dropped."""

    def __init__(self, body: str):
        self.body = body.encode()

    async def __aiter__(self):
        yield self.body
        raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")


def transport(responses: list, seen: list):
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append((request.headers.get("last-event-id"), json.loads(request.content)))
        status, body, cut, ingress = responses.pop(0)
        headers = {"content-type": "text/event-stream", INGRESS_HEADER: ingress}
        if cut:
            return httpx.Response(status, headers=headers, stream=CutStream(body))
        return httpx.Response(status, headers=headers, text=body)
    return httpx.MockTransport(handle)


def token(text: str, event_id: str) -> str:
    return sse("token", {"text": text, "token_ids": [1]}, event_id)


async def _ask(responses, seen, attempts=3):
    async with httpx.AsyncClient(transport=transport(responses, seen)) as http:
        return await ask(http, "http://test", "q?", {"type": "client"}, resume_attempts=attempts)


async def test_an_answer_cut_mid_way_is_resumed_from_the_last_answer_event():
    seen: list = []
    responses = [(200, sse("retrieval_done", {}) + token("Li", "s.r1.1") + token("ma", "s.r1.2"), True, "a"),
                 (503, json.dumps({"error": "Unavailable", "reason": "ingress gone"}), False, "a"),
                 (200, token(".", "s.r1.3") + sse("final", FINAL, "s.r1.3"), False, "b")]
    result = await _ask(responses, seen)
    assert result.ok and result.answer == "Lima." and result.final == FINAL
    assert result.resumed == 2 and result.ingresses == ["a", "a", "b"]
    assert [h for h, _ in seen] == [None, "s.r1.2", "s.r1.2"]  # the same body, from the last answer event
    assert seen[0][1] == seen[1][1] == seen[2][1]


async def test_a_stream_cut_mid_retrieval_is_taken_over_from_the_last_event_before_the_answer():
    seen: list = []
    first = sse("session", {"session_id": "s"}, "s.r1.c0") + sse("context", {"source_id": "d"}, "s.r1.c1")
    rest = (sse("context", {"source_id": "e"}, "s.r1.c2") + sse("retrieval_done", {}, "s.r1.c3")
            + token("Lima", "s.r1.1") + sse("final", FINAL, "s.r1.1"))
    result = await _ask([(200, first, True, "a"), (200, rest, False, "b")], seen)
    assert result.ok and result.answer == "Lima" and result.contexts == 2
    assert result.resumed == 1 and result.taken_over == 1 and result.retried == 0
    assert [h for h, _ in seen] == [None, "s.r1.c1"] and seen[0][1] == seen[1][1]
    assert result.session_id == "s"  # known from the session event's id (leak reports name it)


async def test_a_request_no_ingress_answered_is_sent_again_and_an_ingress_error_is_not():
    seen: list = []
    answer = sse("session", {}, "s.r1.c0") + token("Lima", "s.r1.1") + sse("final", FINAL, "s.r1.1")
    result = await _ask([(500, "Internal Server Error", False, ""), (200, answer, False, "b")], seen)
    assert result.ok and result.retried == 1 and result.resumed == 0
    assert [h for h, _ in seen] == [None, None]
    seen = []
    error = json.dumps({"error": "EngineError", "reason": "boom"})
    result = await _ask([(500, error, False, "a")], seen)
    assert not result.ok and result.retried == 0 and len(seen) == 1 and result.error.startswith("EngineError")


async def test_an_error_event_after_answer_events_is_the_answer_not_a_cut():
    seen: list = []
    body = token("Li", "s.r1.1") + sse("error", {"error": "AnswerNotReproducible", "reason": "sampled"})
    result = await _ask([(200, body, False, "a")], seen)
    assert not result.ok and result.resumed == 0 and len(seen) == 1
    assert result.error == "AnswerNotReproducible: sampled"


async def test_resume_gives_up_after_its_attempts_and_a_client_error_is_final():
    seen: list = []
    cut = (200, token("Li", "s.r1.1"), True, "a")
    result = await _ask([cut, cut, cut], seen, attempts=2)
    assert not result.ok and result.resumed == 2 and len(seen) == 3
    seen.clear()
    refused = (400, json.dumps({"error": "BadRequest", "reason": "not an answer event"}), False, "b")
    result = await _ask([cut, refused], seen)
    assert result.status == 400 and result.resumed == 1 and len(seen) == 2
    assert result.error == "BadRequest: not an answer event"
