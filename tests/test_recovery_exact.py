"""Exact recovery after a lost engine replica, with real Ray, Serve and two tiny-model vLLM replicas.

The ingress's `EngineClient` runs in this process (the driver), over the app's real engine
deployment handle and central scheduler, so that the replica can be killed at the exact moment:
- a retrieval whose replica dies after two pages reached the client, and whose rerun differs (a
  page edited, the order changed, a page added), resumes by chunk identity: the client gets the
  edited page and the new one, never a page twice (counting events would have skipped the
  edited page and sent nothing for the reordered one);
- an answer whose replica dies after its first tokens reached the client is regenerated on
  another replica, checked token by token against the tokens already sent, and continued: the
  client's tokens are the whole answer, once; a regeneration that differs is refused
  (`AnswerDiverged`) and the answer cancelled on that replica.
"""

from __future__ import annotations

import asyncio

import pytest
import ray
from ray import serve

from pipeline.config import AppConfig
from pipeline.control.central import get_or_create_scheduler
from pipeline.errors import AnswerDiverged, unwrap
from pipeline.ingress.replica_client import EngineClient
from pipeline.replica.answers import AnswerEnd, AnswerPiece
from pipeline.replica.context import RetrieverCall
from pipeline_fixtures import cluster_view, serve_app, tiny_config, wait_until
from stream2llm.data.traces import ContextOp
from tests.changing_crawl import ChangingCrawl

pytestmark = [pytest.mark.timeout(900), pytest.mark.random_order(disabled=True)]
CONFIG = tiny_config(limits={"resume_grace_s": 30.0, "admission_timeout_s": 60.0})
ANSWER = 400  # tokens: long enough that the answer is still being generated when its replica dies


@pytest.fixture(scope="module")
def base():
    with serve_app(CONFIG) as url:
        yield url


def client() -> EngineClient:
    config = AppConfig.model_validate(CONFIG)
    handle = serve.get_deployment_handle("EngineReplica", app_name=config.name)
    return EngineClient(handle, get_or_create_scheduler(config), config.limits.admission_timeout_s,
                        config.context_limit)


def two_replicas_serving(base: str) -> None:
    """Both engine replicas running and reporting (after a kill, Serve starts a replacement)."""
    def ready():
        states = serve.status().applications["stream2llm"].deployments["EngineReplica"].replica_states
        return states.get("RUNNING", 0) == 2 and len(cluster_view(base)["replicas"]) >= 2
    wait_until(ready, timeout=240, interval=1.0)


def kill_replica(replica_id: str) -> None:
    ray.kill(ray.get_actor(f"SERVE_REPLICA::stream2llm#EngineReplica#{replica_id}", namespace="serve"),
             no_restart=True)


def test_a_retrieval_rerun_that_differs_resumes_by_chunk_identity(base):
    two_replicas_serving(base)
    crawl = ChangingCrawl.remote()

    async def scenario():
        engine = client()
        session = await engine.open("crawler")
        first, got = session.replica_id, []
        async for name, data in engine.stream_context(session, RetrieverCall(crawl)):
            got.append((name, [s["title"] for s in data.get("sources", [])]))
            if len(got) == 2:  # pages A and B are the client's; the crawl waits: the replica dies now
                kill_replica(first)
        await engine.abort(session)
        return session, first, got

    session, first, got = asyncio.run(scenario())
    assert got == [("context", ["A"]), ("context", ["B"]), ("context", ["B edited"]), ("context", ["C"]),
                   ("retrieval_done", [])]
    assert session.recovered == 1 and session.replica_id != first
    # the citations are what the answering replica holds: the rerun's pages, in its order
    assert [s["title"] for s in session.sources] == ["B edited", "A", "C"] and session.retrieved_chunks == 3
    assert ray.get(crawl.count_runs.remote()) == 2  # the crawl ran again, not the answer from a cache
    ray.kill(crawl)


async def _answer(engine: EngineClient, session, kill_after_tokens: int | None = None):
    """The answer's tokens as the client gets them; the replica killed once it has sent some."""
    tokens, killed, end = [], None, None
    async for item in engine.finish(session, "Go on and on?", {"max_tokens": ANSWER}):
        if isinstance(item, AnswerPiece):
            tokens.extend(item.token_ids)
            if kill_after_tokens is not None and killed is None and len(tokens) >= kill_after_tokens:
                killed = session.replica_id
                kill_replica(killed)
        elif isinstance(item, AnswerEnd):
            end = item
    return tokens, killed, end


async def _session_with(engine: EngineClient, text: str):
    session = await engine.open("client")
    await engine.add(session, ContextOp.APPEND, text)
    return session


CONTEXT = "The answer is in this context, read it closely. " * 6


def test_an_answer_regenerated_after_its_replica_died_is_checked_then_continued(base):
    two_replicas_serving(base)

    async def scenario():
        engine = client()
        reference, _, _ = await _answer(engine, await _session_with(engine, CONTEXT))
        session = await _session_with(engine, CONTEXT)
        tokens, killed, end = await _answer(engine, session, kill_after_tokens=1)
        return reference, session, tokens, killed, end

    reference, session, tokens, killed, end = asyncio.run(scenario())
    assert len(reference) == ANSWER
    assert session.recovered == 1 and session.replica_id != killed, "the replica died after the answer ended"
    assert tokens == reference and end is not None and end.tokens == ANSWER  # each token once, in order


def test_a_regenerated_answer_that_differs_from_what_was_sent_is_refused(base):
    two_replicas_serving(base)
    config = AppConfig.model_validate(CONFIG)
    handle = serve.get_deployment_handle("EngineReplica", app_name=config.name).options(stream=True)

    async def scenario():
        engine = client()
        reference, _, _ = await _answer(engine, await _session_with(engine, CONTEXT))
        session = await _session_with(engine, CONTEXT)
        sent = reference[:5]
        sent[3] = sent[3] + 1  # the client holds an answer that this context does not give
        try:
            async for _ in handle.finish.remote(session.session_id, "Go on and on?", {"max_tokens": ANSWER},
                                                expect=sent, route_to=session.replica_id):
                pass
        except Exception as e:  # a replica's error, in Ray's wrapper
            return session, unwrap(e)
        return session, None

    session, error = asyncio.run(scenario())
    assert isinstance(error, AnswerDiverged) and "at token 3" in str(error), error
    # the refused answer was cancelled and its session freed on the replica (no KV left behind)
    wait_until(lambda: session.session_id not in cluster_view(base)["replicas"].get(session.replica_id, {})
               .get("sessions", []), timeout=30)
