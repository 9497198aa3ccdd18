"""A stateless, replicated ingress over real HTTP (Ray, Serve, tiny vLLM): two ingress replicas,
session records in the shard actors, answers on the replicas.

Consecutive streaming-input calls land on different ingress replicas and the session carries on;
a retry through the other ingress is still a no-op; an ingress killed mid-answer loses nothing:
the client reconnects with Last-Event-ID (through whichever ingress) and gets the rest, and the
sessions it served keep working.
"""

from __future__ import annotations

import httpx
import pytest
import ray

from pipeline.http_util import INGRESS_HEADER
from pipeline_fixtures import serve_app, tiny_config, wait_until
from test_pipeline_resume import ANSWER, _finish_body, _read_some_then_leave, post, sse_with_ids

pytestmark = pytest.mark.timeout(600)
CONTEXT = "Stable context for the same greedy answer. " * 6


@pytest.fixture(scope="module")
def base():
    config = tiny_config(ingress={"replicas": 2}, limits={"resume_grace_s": 30.0, "max_chunks_per_session": 40})
    with serve_app(config) as url:
        yield url


def _open(base) -> str:
    r = post(base, "/v1/streams", {"source_type": "client"})
    assert r.status_code == 201, r.text
    return r.json()["session_id"]


def _answer_tokens(events) -> list[int]:
    return [t for name, data, _ in events if name == "token" for t in data["token_ids"]]


def test_consecutive_calls_on_different_ingress_replicas_share_the_session(base):
    sid = _open(base)
    seen, seq = set(), 0
    while len(seen) < 2 and seq < 30:
        r = post(base, f"/v1/streams/{sid}/chunks", {"text": f"fact {seq}. ", "source_id": f"s{seq}", "seq": seq})
        assert r.status_code == 200 and r.json()["chunks"] == seq + 1, r.text
        seen.add(r.headers[INGRESS_HEADER])
        seq += 1
    assert len(seen) == 2, "the proxy spreads calls over both ingress replicas"
    retries = {post(base, f"/v1/streams/{sid}/chunks", {"text": "again", "seq": seq - 1}) for _ in range(4)}
    assert all(r.json()["duplicate"] and r.json()["chunks"] == seq for r in retries)
    final = sse_with_ids(post(base, f"/v1/streams/{sid}/finish", _finish_body(4)).text)[-1][1]
    assert [c["source_id"] for c in final["citations"]] == [f"s{i}" for i in range(seq)]
    assert post(base, f"/v1/streams/{sid}/finish", _finish_body(4)).status_code == 409


def test_ingress_killed_mid_answer_loses_nothing(base):
    reference = _open(base)
    post(base, f"/v1/streams/{reference}/chunks", {"text": CONTEXT})
    full = _answer_tokens(sse_with_ids(post(base, f"/v1/streams/{reference}/finish", _finish_body()).text))
    assert len(full) == ANSWER

    waiting = _open(base)  # a session opened before the kill, used after it
    post(base, f"/v1/streams/{waiting}/chunks", {"text": "kept in the shard. " * 4, "source_id": "w"})
    sid = _open(base)
    post(base, f"/v1/streams/{sid}/chunks", {"text": CONTEXT})
    first, ingress = _read_some_then_leave(base, f"/v1/streams/{sid}/finish", _finish_body(), 2, with_ingress=True)
    ray.kill(ray.get_actor(f"SERVE_REPLICA::stream2llm#Ingress#{ingress}", namespace="serve"), no_restart=True)

    r = post(base, f"/v1/streams/{sid}/finish", _finish_body(), headers={"Last-Event-ID": first[-1][1]})
    assert r.status_code == 200 and r.headers[INGRESS_HEADER] != ingress, r.text
    tokens = [t for d, _ in first for t in d["token_ids"]] + _answer_tokens(sse_with_ids(r.text))
    assert tokens == full  # nothing lost, nothing twice, nothing generated again
    r = post(base, f"/v1/streams/{waiting}/chunks", {"text": "after the kill. " * 4, "source_id": "w2"})
    assert r.status_code == 200, r.text
    final = sse_with_ids(post(base, f"/v1/streams/{waiting}/finish", _finish_body(4)).text)[-1][1]
    assert [c["source_id"] for c in final["citations"]] == ["w", "w2"]
    wait_until(lambda: httpx.get(f"{base}/healthz", timeout=10).status_code == 200, timeout=60)
