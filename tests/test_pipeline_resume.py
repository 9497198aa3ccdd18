"""Resumable answers, idempotent changes and one error shape, over real HTTP (Ray, Serve, tiny vLLM).

A client that loses its connection mid-answer reconnects with `Last-Event-ID` and gets the rest
from the replica that generated it (no second retrieval or generation); a second finish is a 409;
a retried chunk (same `seq`) is a no-op; every error body has one shape, OpenAI routes OpenAI's.
"""

from __future__ import annotations

import json

import httpx
import pytest

from pipeline_fixtures import serve_app, tiny_config, wait_until

pytestmark = pytest.mark.timeout(600)
ANSWER = 24


@pytest.fixture(scope="module")
def base():
    with serve_app(tiny_config(limits={"resume_grace_s": 30.0})) as url:
        yield url


def post(base, path, body=None, **kw):
    return httpx.post(f"{base}{path}", json=body, timeout=60, **kw)


def sse_with_ids(text: str) -> list[tuple[str, dict, str | None]]:
    out = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in fields:
            out.append((fields["event"], json.loads(fields["data"]), fields.get("id")))
    return out


def _session(base, text="The answer is in this context. " * 8) -> str:
    r = post(base, "/v1/streams", {"source_type": "client"})
    assert r.status_code == 201, r.text
    sid = r.json()["session_id"]
    assert post(base, f"/v1/streams/{sid}/chunks", {"text": text, "seq": 0}).status_code == 200
    return sid


def _finish_body(max_tokens=ANSWER):
    return {"question": "Go on and on?", "sampling": {"max_tokens": max_tokens}}


def _read_some_then_leave(base, path, body, tokens_wanted=2, with_ingress=False):
    """Read answer events until `tokens_wanted` token events, then drop the connection; with
    `with_ingress` also the id of the ingress replica that served the request."""
    got = []
    with httpx.stream("POST", f"{base}{path}", json=body, timeout=60) as r:
        assert r.status_code == 200
        ingress = r.headers.get("x-stream2llm-ingress")
        block: dict = {}
        for line in r.iter_lines():
            if line:
                key, _, value = line.partition(": ")
                block[key] = value
                continue
            if block.get("event") == "token":
                got.append((json.loads(block["data"]), block["id"]))
            block = {}
            if len(got) >= tokens_wanted:
                break
    return (got, ingress) if with_ingress else got


def test_reconnect_with_last_event_id_gets_the_rest_of_the_answer(base):
    reference = sse_with_ids(post(base, f"/v1/streams/{_session(base)}/finish", _finish_body()).text)
    full = [t for n, d, _ in reference if n == "token" for t in d["token_ids"]]
    assert len(full) == ANSWER and all(i for n, _, i in reference)  # every event has an id

    sid = _session(base)
    first = _read_some_then_leave(base, f"/v1/streams/{sid}/finish", _finish_body())
    last_id = first[-1][1]
    assert last_id.startswith(f"{sid}.")
    r = post(base, f"/v1/streams/{sid}/finish", _finish_body(), headers={"Last-Event-ID": last_id})
    assert r.status_code == 200, r.text
    rest = sse_with_ids(r.text)
    assert rest[-1][0] == "final" and rest[-1][1]["resumed"] is True
    tokens = [t for d, _ in first for t in d["token_ids"]] + [t for n, d, _ in rest if n == "token"
                                                              for t in d["token_ids"]]
    assert tokens == full  # greedy: the same answer, each token once
    # EventSource-style GET reconnect from the very start of the answer replays it all.
    again = httpx.get(f"{base}/v1/streams/{sid}/answer", headers={"Last-Event-ID": f"{last_id.rsplit('.', 1)[0]}.0"},
                      timeout=60)
    assert [t for n, d, _ in sse_with_ids(again.text) if n == "token" for t in d["token_ids"]] == full


def test_second_finish_is_409_never_a_second_answer(base):
    sid = _session(base)
    assert sse_with_ids(post(base, f"/v1/streams/{sid}/finish", _finish_body(4)).text)[-1][0] == "final"
    r = post(base, f"/v1/streams/{sid}/finish", _finish_body(4))
    assert r.status_code == 409 and r.json()["error"] == "SessionConflict" and "Last-Event-ID" in r.json()["reason"]


def test_retried_chunk_with_the_same_seq_is_a_no_op(base):
    sid = _session(base, "first chunk. " * 4)
    once = post(base, f"/v1/streams/{sid}/chunks", {"text": "second chunk. " * 4, "seq": 1})
    twice = post(base, f"/v1/streams/{sid}/chunks", {"text": "second chunk. " * 4, "seq": 1})
    assert once.status_code == twice.status_code == 200
    assert once.json()["duplicate"] is False and twice.json()["duplicate"] is True
    assert twice.json()["context_tokens"] == once.json()["context_tokens"]
    assert twice.json()["chunks"] == 2
    stale = post(base, f"/v1/streams/{sid}/chunks", {"text": "an old retry", "seq": 0})
    assert stale.json()["duplicate"] is True
    httpx.delete(f"{base}/v1/streams/{sid}", timeout=30)


def test_answer_abandoned_mid_way_still_ends_and_frees_kv(base):
    sid = _session(base)
    _read_some_then_leave(base, f"/v1/streams/{sid}/finish", _finish_body(200))
    wait_until(lambda: all(r["kv_blocks_used"] == 0 for r in httpx.get(f"{base}/v1/cluster", timeout=10)
                           .json()["replicas"].values()), timeout=60)


@pytest.mark.parametrize("method, path, body, status", [
    ("get", "/v1/nowhere", None, 404),
    ("delete", "/v1/rag", None, 405),
    ("post", "/v1/streams", b'{"source_type": 3}', 422),
])
def test_every_error_has_one_shape(base, method, path, body, status):
    r = httpx.request(method.upper(), f"{base}{path}", content=body, timeout=30,
                      headers={"content-type": "application/json"})
    assert r.status_code == status and set(r.json()) == {"error", "reason"}, r.text


def test_openai_routes_answer_with_openai_error_objects(base):
    r = post(base, "/v1/completions", {"model": "nope", "prompt": "Hi"})
    assert r.status_code == 404
    err = r.json()["error"]
    assert err["code"] == "model_not_found" and err["type"] == "invalid_request_error" and "nope" in err["message"]
    r = post(base, "/v1/chat/completions", {"model": "stream2llm", "messages": "not a list"})
    assert r.status_code == 422 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    r = post(base, "/v1/completions", {"model": "stream2llm", "prompt": "Hi", "max_tokens": 100000})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
