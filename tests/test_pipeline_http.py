"""The whole pipeline over real HTTP on loopback: real Ray, real Serve, two tiny-model replicas.

One Serve app for the module (it takes ~1-1.5 min to come up on 2 cores). Tests that change the
cluster (central actor restart, replica kill) run last, in file order.
"""

import threading
import time

import httpx
import pytest
import ray

from pipeline_fixtures import cluster_view, parse_sse, serve_app, tiny_config, wait_until

# One app serves the whole file and its last tests change the cluster (a replica killed): in a
# random-order run (pytest-random-order) the file keeps its own order, among shuffled files.
pytestmark = [pytest.mark.timeout(600), pytest.mark.random_order(disabled=True)]


# A queued admission waits ADMISSION_TIMEOUT_S: long enough for the calls that must happen while a
# session waits (a loaded 2-core machine takes seconds per HTTP call at worst). The sessions that
# keep the replicas full meanwhile must not expire under it: the idle TTL is well above it.
ADMISSION_TIMEOUT_S = 6.0
SESSION_TTL_S = 20.0


@pytest.fixture(scope="module")
def base():
    limits = {"admission_timeout_s": ADMISSION_TIMEOUT_S, "session_ttl_s": SESSION_TTL_S}
    with serve_app(tiny_config(limits=limits)) as url:
        yield url


def post(base, path, body=None, **kw):
    return httpx.post(f"{base}{path}", json=body, timeout=kw.pop("timeout", 60), **kw)


def open_stream(base, source_type="client"):
    r = post(base, "/v1/streams", {"source_type": source_type})
    assert r.status_code == 201, r.text
    return r.json()


def append(base, sid, text, **extra):
    return post(base, f"/v1/streams/{sid}/chunks", {"text": text, **extra})


def finish(base, sid, question="What is the capital?", max_tokens=8):
    r = post(base, f"/v1/streams/{sid}/finish", {"question": question, "sampling": {"max_tokens": max_tokens}})
    assert r.status_code == 200, r.text
    return parse_sse(r.text)


def sessions_everywhere(base) -> set:
    return {s for r in cluster_view(base)["replicas"].values() for s in r["sessions"]}


# ---- streaming-input API -----------------------------------------------------------------
def test_stream_append_then_finish_streams_tokens_and_final(base):
    s = open_stream(base)
    r1 = append(base, s["session_id"], "Paris is the capital of France. " * 4, source_id="fr", title="France")
    r2 = append(base, s["session_id"], "Berlin is the capital of Germany. " * 4, source_id="de", title="Germany")
    assert r1.status_code == r2.status_code == 200
    assert r2.json()["context_tokens"] > r1.json()["context_tokens"] > 0
    events = finish(base, s["session_id"])
    names = [n for n, _ in events]
    assert names[-1] == "final" and names.count("token") >= 1
    final = events[-1][1]
    assert final["replica_id"] == s["replica_id"] and final["recovered"] is False
    assert [c["source_id"] for c in final["citations"]] == ["fr", "de"]
    assert final["ttft_s"] is not None and final["ttft_s"] >= 0
    # The finish follows the append at once, so its prefill may still be running: anything from 0 to
    # the whole context is legitimate, more is not.
    assert 0 <= final["tokens_prefilled_before_finish"] <= r2.json()["context_tokens"]
    assert final["output_tokens"] == sum(len(d["token_ids"]) for n, d in events if n == "token")
    assert httpx.get(f"{base}/v1/streams/{s['session_id']}").status_code == 404


def test_replace_context_invalidates_the_tail(base):
    s = open_stream(base, "vector")
    sid = s["session_id"]
    append(base, sid, "alpha beta gamma delta. " * 10)
    r = httpx.put(f"{base}/v1/streams/{sid}/context", timeout=60, json={"chunks": [
        {"text": "alpha beta gamma delta. " * 5, "source_id": "a"},
        {"text": "completely different words here. " * 5, "source_id": "b"}]})
    assert r.status_code == 200, r.text
    final = finish(base, sid)[-1][1]
    assert final["tokens_invalidated"] > 0
    assert [c["source_id"] for c in final["citations"]] == ["a", "b"]


def test_finish_without_stream_returns_json(base):
    s = open_stream(base)
    append(base, s["session_id"], "some context")
    r = post(base, f"/v1/streams/{s['session_id']}/finish", {"question": "q?", "stream": False,
                                                             "sampling": {"max_tokens": 4}})
    body = r.json()
    assert r.status_code == 200 and body["final"]["output_tokens"] == 4 and body["answer"]


def test_delete_frees_the_session(base):
    s = open_stream(base)
    append(base, s["session_id"], "context to throw away " * 20)
    assert httpx.delete(f"{base}/v1/streams/{s['session_id']}", timeout=30).status_code == 204
    assert httpx.delete(f"{base}/v1/streams/{s['session_id']}", timeout=30).status_code == 404
    wait_until(lambda: s["session_id"] not in sessions_everywhere(base), timeout=30)


# ---- /v1/rag --------------------------------------------------------------------------------
def test_rag_inline_documents_streams_context_then_answer(base):
    r = post(base, "/v1/rag", {"question": "Which city?", "stream": True, "sampling": {"max_tokens": 6},
                               "source": {"type": "documents", "documents": ["Rome is in Italy.", "Oslo is in Norway."]}})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(r.text)
    names = [n for n, _ in events]
    # first the session's own event (its id lets a client cut before the answer resume), then the context
    assert names[:3] == ["session", "context", "context"] and names[-1] == "final"
    assert names.index("retrieval_done") < names.index("token")
    final = events[-1][1]
    assert [c["source_id"] for c in final["citations"]] == ["doc-0", "doc-1"]
    # Inline documents arrive all at once, so the question may be handed over before their prefill
    # completes: zero prefilled tokens is legitimate here; a negative or missing count is not.
    assert final["retrieval_s"] >= 0 and final["tokens_prefilled_before_finish"] >= 0


def test_rag_offline_corpus_documents_non_streaming(base):
    from stream2llm.data.corpus import load_grounded_questions

    q = load_grounded_questions()[0]
    r = post(base, "/v1/rag", {"question": q.question, "stream": False, "sampling": {"max_tokens": 4},
                               "source": {"type": "corpus", "doc_ids": [q.doc_id]}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["contexts"][0]["sources"][0]["url_or_doc_id"] == q.doc_id
    assert body["final"]["citations"][0]["source_id"] == q.doc_id


def _rag_answer(base, documents, mode):
    r = post(base, "/v1/rag", {"question": "Which city is named?", "prompt_mode": mode, "sampling": {"max_tokens": 8},
                               "source": {"type": "documents", "documents": documents}})
    assert r.status_code == 200, r.text
    events = parse_sse(r.text)
    tokens = [t for name, data in events if name == "token" for t in data["token_ids"]]
    return events, tokens


def test_rag_oneshot_baseline_answers_like_streaming_from_the_same_context(base):
    # The third document is over the context limit: both modes must skip it the same way.
    documents = ["Rome is in Italy. " * 20, "Oslo is in Norway. " * 20, "word " * 1500, "Lima is in Peru."]
    stream_events, stream_tokens = _rag_answer(base, documents, "stream")
    oneshot_events, oneshot_tokens = _rag_answer(base, documents, "oneshot")
    assert len(stream_tokens) == 8 and oneshot_tokens == stream_tokens
    for events in (stream_events, oneshot_events):
        assert [n for n, _ in events].count("context_skipped") == 1
    final = oneshot_events[-1][1]
    assert final["prompt_mode"] == "oneshot" and final["tokens_prefilled_before_finish"] == 0
    assert [c["source_id"] for c in final["citations"]] == ["doc-0", "doc-1", "doc-3"]
    assert final["ttft_s"] > 0 and final["context_tokens"] > stream_events[-1][1]["tokens_prefilled_before_finish"]


def test_concurrent_one_shot_generations_do_not_collide(base):
    bodies = [{"model": "stream2llm", "prompt": f"Hello number {i}", "max_tokens": 4} for i in range(3)]
    results = [None] * 3

    def call(i):
        results[i] = post(base, "/v1/completions", bodies[i])

    threads = [threading.Thread(target=call, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4 for r in results)


# ---- bad input and limits -----------------------------------------------------------------------
@pytest.mark.parametrize("body, status, error", [
    (b"{not json", 400, "MalformedJSON"),
    (b'{"question": 5, "source": {"type": "documents", "documents": ["x"]}}', 422, "ValidationError"),
    (b'{"question": "q", "source": {"type": "crawl"}}', 422, "ValidationError"),
    (b'{"question": "q", "source": {"type": "documents", "documents": ["x"]}, "extra": 1}', 422,
     "ValidationError"),
    (b'{"question": "q", "source": {"type": "documents", "documents": ["x"]}, "sampling": {"max_tokens": 1000}}',
     413, "LimitExceeded"),  # over the answer budget (512)
    (b'{"question": "q", "source": {"type": "documents", "documents": ["x"]}, "sampling": {"max_tokens": 9999}}',
     400, "NeverFits"),  # over the model's length (2048): no context would leave it room
])
def test_bad_rag_requests_get_4xx_with_reason(base, body, status, error):
    r = httpx.post(f"{base}/v1/rag", content=body, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == status, r.text
    assert r.json()["error"] == error and r.json()["reason"]


def test_request_size_limit(base):
    r = append(base, "whatever", "x" * (70 * 1024))
    assert r.status_code == 413 and r.json()["error"] == "RequestTooLarge"


def test_unknown_session_is_404(base):
    r = append(base, "nope", "text")
    assert r.status_code == 404 and "nope" in r.json()["reason"]


def test_chunks_per_session_and_context_token_limits(base):
    s = open_stream(base)
    for _ in range(6):
        assert append(base, s["session_id"], "a few words").status_code == 200
    r = append(base, s["session_id"], "one too many")
    assert r.status_code == 413 and "limit 6" in r.json()["reason"]
    s2 = open_stream(base)
    r = append(base, s2["session_id"], "word " * 1500)
    assert r.status_code == 400 and r.json()["error"] == "ContextLimitExceeded"  # can never fit: 400
    assert "exceeds the limit of 1200" in r.json()["reason"]
    assert finish(base, s2["session_id"])[-1][0] == "final"  # the session stayed usable


# ---- OpenAI-compatible routes --------------------------------------------------------------------
def test_openai_models_and_completions(base):
    assert httpx.get(f"{base}/v1/models").json()["data"][0]["id"] == "stream2llm"
    r = post(base, "/v1/completions", {"model": "stream2llm", "prompt": "Hello", "max_tokens": 5})
    body = r.json()
    assert r.status_code == 200 and body["object"] == "text_completion"
    assert body["usage"]["completion_tokens"] == 5 and body["choices"][0]["text"]
    r = post(base, "/v1/completions", {"model": "other", "prompt": "Hello"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_openai_chat_streaming_and_not(base):
    msg = {"model": "stream2llm", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    r = post(base, "/v1/chat/completions", msg)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["role"] == "assistant"
    r = post(base, "/v1/chat/completions", {**msg, "stream": True})
    lines = [ln for ln in r.text.splitlines() if ln.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and len(lines) >= 2
    assert '"chat.completion.chunk"' in lines[0]


# ---- admission, routing, metrics ---------------------------------------------------------------
def _cluster_idle(base) -> bool:
    """No session placed, queued or holding KV anywhere (other tests' sessions end or expire)."""
    view = cluster_view(base)
    return (view["pressure"]["sessions"] == 0 and view["pressure"]["queued"] == 0
            and all(r["projected_used"] == 0 for r in view["replicas"].values()))


def test_big_sessions_spread_over_replicas_then_queue_then_429(base):
    wait_until(lambda: _cluster_idle(base), timeout=90)  # the premise needs both replicas empty, in any order
    view = cluster_view(base)
    one = next(iter(view["replicas"].values()))
    capacity = one["kv_blocks_total"] * one["block_size"]
    assert capacity * 0.5 < 20000 < capacity * 0.95, "test premise: one 'big' session per replica"
    a, b = open_stream(base, "big"), open_stream(base, "big")
    assert a["replica_id"] != b["replica_id"]  # most projected headroom, not round robin
    started = time.monotonic()
    r = post(base, "/v1/streams", {"source_type": "big"})
    assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
    assert time.monotonic() - started >= ADMISSION_TIMEOUT_S - 0.5  # it waited in the queue first
    results = {}
    waiter = threading.Thread(target=lambda: results.setdefault("r", post(base, "/v1/streams", {"source_type": "big"})))
    waiter.start()
    wait_until(lambda: cluster_view(base)["pressure"]["queued"] == 1, timeout=ADMISSION_TIMEOUT_S - 1, interval=0.1)
    full = post(base, "/v1/streams", {"source_type": "big"})  # queue (size 1) is taken
    assert full.status_code == 429 and "queue full" in full.json()["reason"]
    httpx.delete(f"{base}/v1/streams/{a['session_id']}", timeout=30)
    waiter.join()
    assert results["r"].status_code == 201 and results["r"].json()["replica_id"] == a["replica_id"]
    for sid in (b["session_id"], results["r"].json()["session_id"]):
        httpx.delete(f"{base}/v1/streams/{sid}", timeout=30)
    huge = post(base, "/v1/streams", {"source_type": "huge"})
    assert huge.status_code == 429


def _metric(text: str, prefix: str) -> float:
    lines = [ln for ln in text.splitlines() if ln.startswith(prefix)]
    return float(lines[0].split()[-1]) if lines else 0.0


def test_metrics_and_health(base):
    """Self-contained (passes alone and in any order): it makes the TTFT and the rejection it counts."""
    assert httpx.get(f"{base}/healthz").json()["ok"] is True
    before = httpx.get(f"{base}/metrics", timeout=30).text
    s = open_stream(base)
    # Streams of the same type opened right after: from the slots the earlier admissions asked for.
    # A slot is used within 1 s of being asked for, so a slow open on a loaded machine may let one
    # go stale: keep opening until one is admitted from a slot, against a deadline, not a count.
    from_slots = 'stream2llm_admissions{path="slot"}'

    def opened_one_from_a_slot() -> bool:
        extra = open_stream(base)
        httpx.delete(f"{base}/v1/streams/{extra['session_id']}", timeout=30)
        return _metric(httpx.get(f"{base}/metrics", timeout=30).text, from_slots) > _metric(before, from_slots)

    wait_until(opened_one_from_a_slot, timeout=120, interval=0)
    append(base, s["session_id"], "context " * 20)
    finish(base, s["session_id"])
    assert post(base, "/v1/streams", {"source_type": "huge"}).status_code == 429  # larger than any replica
    text = httpx.get(f"{base}/metrics", timeout=30).text
    ttft = 'stream2llm_ttft_seconds_count{endpoint="streams"}'
    assert _metric(text, ttft) >= _metric(before, ttft) + 1
    assert text.count("stream2llm_kv_usage_ratio{replica=") == 2
    rejected = "stream2llm_admissions_rejected_total"
    assert _metric(text, rejected) >= _metric(before, rejected) + 1
    assert _metric(text, from_slots) >= _metric(before, from_slots) + 1


# ---- lifetime and faults (cluster-changing tests last) -------------------------------------------------
def test_client_disconnect_mid_answer_aborts_and_frees_kv(base):
    s = open_stream(base)
    append(base, s["session_id"], "context " * 200)
    with httpx.stream("POST", f"{base}/v1/streams/{s['session_id']}/finish", timeout=60,
                      json={"question": "go on", "sampling": {"max_tokens": 500}}) as r:
        for line in r.iter_lines():
            if line.startswith("event: token"):
                break  # leaving the block closes the connection mid-answer
    wait_until(lambda: s["session_id"] not in sessions_everywhere(base), timeout=45)
    wait_until(lambda: all(r["sessions_active"] + r["sessions_idle"] == 0 and r["kv_blocks_used"] == 0
                           for r in cluster_view(base)["replicas"].values()), timeout=45)


def test_idle_session_expires_after_ttl(base):
    s = open_stream(base)
    append(base, s["session_id"], "abandoned " * 50)
    wait_until(lambda: s["session_id"] in sessions_everywhere(base), timeout=30)
    wait_until(lambda: s["session_id"] not in sessions_everywhere(base), timeout=SESSION_TTL_S + 45)
    wait_until(lambda: httpx.get(f"{base}/v1/streams/{s['session_id']}").status_code == 404, timeout=10)


def test_central_actor_restart_rebuilds_view_and_keeps_sessions(base):
    s = open_stream(base)
    append(base, s["session_id"], "kept across the restart " * 10)
    actor = ray.get_actor("stream2llm_scheduler", namespace="stream2llm")
    before = ray.get(actor.ping.remote())["started_at"]
    ray.kill(actor, no_restart=False)
    wait_until(lambda: _restarted(actor, before), timeout=30)
    wait_until(lambda: s["session_id"] in sessions_everywhere(base), timeout=45)
    assert cluster_view(base)["pressure"]["sessions"] >= 1
    assert finish(base, s["session_id"])[-1][0] == "final"


def _restarted(actor, before):
    try:
        return ray.get(actor.ping.remote(), timeout=5)["started_at"] != before
    except Exception:
        return False


def test_replica_killed_mid_stream_is_recovered_elsewhere(base):
    s = open_stream(base)
    append(base, s["session_id"], "first chunk before the crash. " * 5, source_id="c1")
    victim = ray.get_actor(f"SERVE_REPLICA::stream2llm#EngineReplica#{s['replica_id']}", namespace="serve")
    ray.kill(victim, no_restart=True)
    r = append(base, s["session_id"], "second chunk after the crash. " * 5, source_id="c2")
    assert r.status_code == 200, r.text
    assert r.json()["replica_id"] != s["replica_id"] and r.json()["recovered"] == 1
    final = finish(base, s["session_id"])[-1][1]
    assert final["recovered"] is True and final["replica_id"] != s["replica_id"]
    assert [c["source_id"] for c in final["citations"]] == ["c1", "c2"]
    assert 0 <= final["tokens_prefilled_before_finish"] <= r.json()["context_tokens"]
    # An answer dies with its replica: a resume naming the killed one is told to ask again.
    gone = "0" * 32
    r = httpx.get(f"{base}/v1/streams/{gone}/answer", headers={"Last-Event-ID": f"{gone}.{s['replica_id']}.1"},
                  timeout=60)
    assert r.status_code == 404 and r.json()["error"] == "SessionGone" and "ask again" in r.json()["reason"], r.text
