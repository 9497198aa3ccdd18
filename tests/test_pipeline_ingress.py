"""A stateless, replicated ingress over real HTTP (Ray, Serve, tiny vLLM): two ingress replicas,
session records in the shard actors, answers on the replicas.

Consecutive streaming-input calls land on different ingress replicas and the session carries on;
a retry through the other ingress is still a no-op; an ingress killed mid-answer loses nothing:
the client reconnects with Last-Event-ID (through whichever ingress) and gets the rest, and the
sessions it served keep working. A /v1/rag session cut mid-retrieval by its ingress's death is
taken over: the client reconnects with the id of the last event it got, and gets the rest of the
context events and the answer from the retrieval that went on on its replica (nothing run twice).
A /v1/rag session is freed long before the idle TTL when the ingress driving it dies and no client
takes it over: mid-retrieval (nobody tails its retrieval, which stops after the resume grace), or
between calls (its replica finds the owner recorded at open gone). An ingress that dies between
claiming a chunk's seq and committing it leaves no hole: the retry applies it, once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid

import httpx
import pytest
import ray

from pipeline.ingress.http_util import INGRESS_HEADER
from pipeline.control.liveness import serve_actor_alive
from pipeline_fixtures import serve_app, tiny_config, wait_until
from stream2llm.data.traces import synthetic_crawler_traces, write_crawler_csv
from test_pipeline_resume import ANSWER, _finish_body, _read_some_then_leave, post, sse_with_ids

pytestmark = [pytest.mark.timeout(600), pytest.mark.random_order(disabled=True)]  # the kills change the layout
CONTEXT = "Stable context for the same greedy answer. " * 6
SESSION_TTL_S = 900.0
SLOW_TRACE_END_S = 30.0  # 90 s at the module's 3x pace


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    traces = tmp_path_factory.mktemp("traces")
    write_crawler_csv([_slow_trace()], traces / "slow.csv")
    write_crawler_csv([_paced_trace()], traces / "paced.csv")
    config = tiny_config(ingress={"replicas": 2}, retrievers={"trace_dir": str(traces), "trace_multiplier": 3.0},
                         limits={"resume_grace_s": 15.0, "max_chunks_per_session": 40, "session_ttl_s": SESSION_TTL_S})
    with serve_app(config) as url:
        yield url


def _slow_trace():
    """A retrieval that finds two pieces at once, then waits SLOW_TRACE_END_S (trace time) for its
    last: a session mid-retrieval for 90 s at the module's 3x pace, longer than any wait for a
    replica report to list it, however loaded the machine."""
    trace = synthetic_crawler_traces(1, seed=5, tokens_scale=0.05, mean_scrapes=4)[0]
    first, second, last = trace.events[0], trace.events[1], trace.events[-1]
    events = (dataclasses.replace(first, start_s=0.0, end_s=0.2), dataclasses.replace(second, start_s=0.2, end_s=0.4),
              dataclasses.replace(last, start_s=0.4, end_s=SLOW_TRACE_END_S))
    return dataclasses.replace(trace, events=events)


def _paced_trace():
    """Three pieces, the last two 6 s and 12 s in at the module's 3x pace: a client cut after the
    first is away while the rest is retrieved."""
    trace = synthetic_crawler_traces(1, seed=7, tokens_scale=0.05, mean_scrapes=4)[0]
    events = tuple(dataclasses.replace(e, start_s=start, end_s=end)
                   for e, (start, end) in zip(trace.events, ((0.0, 0.2), (0.2, 2.0), (2.0, 4.0))))
    return dataclasses.replace(trace, events=events)


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


def _replica_sessions(base) -> set[str]:
    view = httpx.get(f"{base}/v1/cluster", timeout=10).json()
    return {sid for r in view["replicas"].values() for sid in r["sessions"]}


def test_rag_session_cut_mid_retrieval_by_its_ingress_death_is_taken_over(base):
    body = {"question": "What was found?", "source": {"type": "trace", "trace": "paced.csv"},
            "sampling": {"max_tokens": 8, "temperature": 0.0}}
    reference = sse_with_ids(post(base, "/v1/rag", body).text)
    assert reference[-1][0] == "final", reference
    got = []
    with httpx.stream("POST", f"{base}/v1/rag", json=body, timeout=60) as r:
        assert r.status_code == 200
        ingress = r.headers[INGRESS_HEADER]
        block: dict = {}
        for line in r.iter_lines():  # up to the first context event: the retrieval goes on after it
            if line:
                key, _, value = line.partition(": ")
                block[key] = value
                continue
            got.append((block["event"], json.loads(block["data"]), block.get("id")))
            block = {}
            if got[-1][0] == "context":
                break
        name = f"SERVE_REPLICA::stream2llm#Ingress#{ingress}"
        ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)
        wait_until(lambda: not asyncio.run(serve_actor_alive(name)), timeout=60)
    assert [n for n, _, _ in got] == ["session", "context"], got
    r = post(base, "/v1/rag", body, headers={"Last-Event-ID": got[-1][2]})
    assert r.status_code == 200 and r.headers[INGRESS_HEADER] != ingress, r.text
    rest = sse_with_ids(r.text)
    names = [n for n, _, _ in got + rest]
    assert names.count("context") == 3 and names.count("retrieval_done") == 1, names  # none twice, none lost
    final = rest[-1][1]
    assert rest[-1][0] == "final" and final["recovered"] is False, rest
    assert len(final["citations"]) == 3 and final["chunks"] == 3, final
    # the same greedy answer as a run never cut: its replica prefilled each piece once
    assert [t for n, d, _ in rest if n == "token" for t in d["token_ids"]] == \
        [t for n, d, _ in reference if n == "token" for t in d["token_ids"]]
    wait_until(lambda: final["session_id"] not in _replica_sessions(base), timeout=60)
    wait_until(lambda: httpx.get(f"{base}/healthz", timeout=10).status_code == 200, timeout=60)


def test_rag_session_of_an_ingress_killed_mid_retrieval_is_freed(base):
    body = {"question": "What was found?", "source": {"type": "trace", "trace": "slow.csv"}}
    with httpx.stream("POST", f"{base}/v1/rag", json=body, timeout=60) as r:
        assert r.status_code == 200
        ingress = r.headers[INGRESS_HEADER]
        event_id = next(line[len("id: "):] for line in r.iter_lines() if line.startswith("id: "))
        session_id = event_id.split(".")[0]  # the session event's id: <session>.<replica>.c0
        # the view comes from replica reports (every 0.5 s, later on a loaded machine); the slow
        # trace's retrieval lasts 90 s, so the session is still retrieving when it shows
        waited = time.monotonic()
        wait_until(lambda: session_id in _replica_sessions(base), timeout=60)
        print(f"session listed by its replica's report after {time.monotonic() - waited:.1f} s")
        name = f"SERVE_REPLICA::stream2llm#Ingress#{ingress}"
        ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)
        # the connection stays open until the ingress is dead: a client disconnect would have the
        # living ingress abort the session itself, which is not what this test is about
        wait_until(lambda: not asyncio.run(serve_actor_alive(name)), timeout=60)
    killed = time.monotonic()
    wait_until(lambda: session_id not in _replica_sessions(base), timeout=120)  # the idle TTL is 900 s
    print(f"session freed {time.monotonic() - killed:.1f} s after its ingress died")
    wait_until(lambda: httpx.get(f"{base}/healthz", timeout=10).status_code == 200, timeout=60)


@ray.remote(num_cpus=0)
class StandInIngress:
    """An actor that only has a name: the owner a session is opened for."""


def test_session_idle_between_calls_is_aborted_once_its_owner_is_gone(base):
    """The window no call covers: an ingress that opened a /v1/rag session (inline documents are
    added call by call) dies between two calls. Nothing is cancelled; the replica must notice."""
    from ray import serve

    name = f"stand-in-ingress-{uuid.uuid4().hex[:8]}"
    owner = StandInIngress.options(name=name, namespace="serve").remote()
    engine = serve.get_deployment_handle("EngineReplica", app_name="stream2llm")
    session_id = uuid.uuid4().hex
    engine.open_session.remote(session_id, "documents", name).result(timeout_s=60)
    kept = uuid.uuid4().hex  # the same, with an owner that lives on
    engine.open_session.remote(kept, "documents", None).result(timeout_s=60)
    wait_until(lambda: {session_id, kept} <= _replica_sessions(base), timeout=60)
    ray.kill(owner, no_restart=True)
    wait_until(lambda: session_id not in _replica_sessions(base), timeout=60)  # the idle TTL is 900 s
    assert kept in _replica_sessions(base)
    engine.abort.remote(kept).result(timeout_s=60)


@ray.remote(num_cpus=0)
class DyingIngress:
    """Does what an ingress does with a chunk that has a seq, up to its commit: claims the seq at
    the session's shard and applies the chunk on the session's replica (the app's own actors)."""

    def __init__(self, config: dict, name: str):
        from pipeline.config import AppConfig
        from pipeline.sessions.store import SessionStore

        self.store = SessionStore(AppConfig.model_validate(config), owner=name)  # the app's shards

    async def claim_and_apply(self, session_id: str, seq: int, text: str) -> int:
        from ray import serve

        from stream2llm.data.traces import ContextOp

        log, duplicate = await self.store.get(session_id, claim_seq=seq)
        assert not duplicate
        engine = serve.get_deployment_handle("EngineReplica", app_name="stream2llm")
        return await engine.change_context.remote(session_id, ContextOp.APPEND, text, None, seq,
                                                  route_to=log.replica_id)


def test_ingress_dying_between_claim_and_commit_leaves_no_hole(base):
    """The fault at that moment: the chunk is claimed and prefilled, then its ingress dies. The
    client's retry (through a living ingress) is applied, not taken for a duplicate, and the replica
    does not prefill it a second time; from then on it is a duplicate."""
    sid = _open(base)
    chunk = {"text": "second fact. " * 4, "seq": 1}
    assert post(base, f"/v1/streams/{sid}/chunks", {"text": "first fact. ", "seq": 0}).status_code == 200
    name = f"SERVE_REPLICA::stand-in-{uuid.uuid4().hex[:8]}"
    config = tiny_config(limits={"session_ttl_s": SESSION_TTL_S})  # the shards' names and TTL as the app's
    dying = DyingIngress.options(name=name, namespace="serve").remote(config, name)
    prefilled = ray.get(dying.claim_and_apply.remote(sid, 1, chunk["text"]), timeout=120)
    busy = post(base, f"/v1/streams/{sid}/chunks", chunk)  # its ingress still lives: being applied
    assert busy.status_code == 409 and "being applied" in busy.json()["reason"], busy.text
    ray.kill(dying, no_restart=True)
    wait_until(lambda: not asyncio.run(serve_actor_alive(name)), timeout=60)
    retry = post(base, f"/v1/streams/{sid}/chunks", chunk)
    assert retry.status_code == 200 and retry.json()["duplicate"] is False, retry.text
    assert retry.json()["chunks"] == 2 and retry.json()["context_tokens"] == prefilled  # applied once
    again = post(base, f"/v1/streams/{sid}/chunks", chunk)
    assert again.json()["duplicate"] is True and again.json()["chunks"] == 2
    r = post(base, f"/v1/streams/{sid}/finish", {"question": "Which facts?", "sampling": {"max_tokens": 4}})
    name, final, _ = sse_with_ids(r.text)[-1]
    assert r.status_code == 200 and name == "final" and final["chunks"] == 2, r.text
