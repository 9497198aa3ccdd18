"""Admission from real use over HTTP (issue 32): the issue's measured failure, requests that can
never fit, and start-up.

One replica of the tiny model with the issue's 4,096-block KV cache (64 MiB) and the default
2,048-token prior for client sessions: before, the 61st client session opened with one short
chunk waited the admission deadline and got 429 at 1.5% real KV use. The app is deployed without
waiting for it, and the fixture records what the routes answered while the engine replica started.
"""

import concurrent.futures
import contextlib
import threading
import time

import httpx
import openai
import pytest
import ray
from ray import serve

from pipeline.app import build_app
from pipeline.config import AppConfig
from pipeline.run.local import REPO, free_port, wait_ready
from pipeline_fixtures import TINY_DTYPE, cluster_view, wait_until

pytestmark = pytest.mark.timeout(900)

SESSIONS = 100  # the replica refused the 61st
DEADLINE_S = 10.0
CONFIG = {
    "model": {"model": "tiny", "dtype": TINY_DTYPE, "max_model_len": 2048, "kv_cache_memory_bytes": 64 << 20,
              "answer_budget_tokens": 256},
    "replicas": {"min_replicas": 1, "max_replicas": 1, "num_cpus": 1.0, "report_interval_s": 0.5},
    "limits": {"admission_timeout_s": DEADLINE_S, "session_ttl_s": 300.0},
}
LONG = "word " * 3000  # over the model's 2,048 tokens, whatever the tokenizer


def _ours(r: httpx.Response) -> bool:
    return "x-stream2llm-ingress" in r.headers  # answered by our ingress, not by Serve's proxy


def _probe_startup(base: str, seen: dict) -> None:
    """Until a replica reported: what /v1/models answers, and one session opened meanwhile."""
    opener = None
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{base}/healthz", timeout=5).status_code == 200:
                break
            r = httpx.get(f"{base}/v1/models", timeout=10)
            if _ours(r):
                seen["models"].append((r.status_code, r.headers.get("retry-after"), r.json()))
                if opener is None:  # a request arriving while the replica starts
                    opener = threading.Thread(target=_open_early, args=(base, seen))
                    opener.start()
        time.sleep(0.3)
    if opener is not None:
        opener.join()


def _open_early(base: str, seen: dict) -> None:
    started = time.monotonic()
    r = httpx.post(f"{base}/v1/streams", json={"source_type": "client"}, timeout=120)
    seen["early_open"] = (r.status_code, r.headers.get("retry-after"), time.monotonic() - started)


@pytest.fixture(scope="module")
def app():
    import os

    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), REPO) if p)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    seen: dict = {"models": []}
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port}, proxy_location="HeadOnly")
        config = AppConfig.model_validate(CONFIG)
        deploy = threading.Thread(target=serve.run, args=(build_app(config),),
                                  kwargs={"name": config.name, "route_prefix": "/"}, daemon=True)
        deploy.start()  # serve.run returns once every replica runs: probe meanwhile
        _probe_startup(base, seen)
        wait_ready(base, 300.0)
        yield base, seen
    finally:
        with contextlib.suppress(Exception):
            serve.shutdown()
        ray.shutdown()


def test_no_route_is_ready_before_a_replica_and_early_requests_wait_or_get_503(app):
    base, seen = app
    statuses = [status for status, _, _ in seen["models"]]
    assert statuses and statuses[0] == 503, "the ingress never answered before the replica reported"
    ready = statuses.index(200) if 200 in statuses else len(statuses)  # a report may land between probes
    assert set(statuses[:ready]) == {503} and set(statuses[ready:]) <= {200}, statuses
    for status, retry_after, body in seen["models"][:ready]:
        assert int(retry_after) >= 1 and body["error"]["code"] == "ReplicaNotReady", body
    status, retry_after, waited = seen["early_open"]
    assert status in (201, 503), seen["early_open"]  # it waited for the replica, or 503: never 429
    if status == 503:
        assert int(retry_after) >= 1 and waited >= DEADLINE_S * 0.9
    assert httpx.get(f"{base}/v1/models", timeout=10).json()["data"][0]["id"] == "stream2llm"


def _one_short_session(base: str, i: int) -> tuple[int, int, str | None]:
    with httpx.Client(base_url=base, timeout=120) as c:
        r = c.post("/v1/streams", json={"source_type": "client"})
        if r.status_code != 201:
            return r.status_code, 0, None
        sid = r.json()["session_id"]
        chunk = c.post(f"/v1/streams/{sid}/chunks", json={"text": f"Fact {i}: Paris is in France."})
        return r.status_code, chunk.status_code, sid


def test_many_short_client_sessions_are_all_admitted_while_real_kv_use_is_low(app):
    base, _ = app
    rejected_before = cluster_view(base)["pressure"]["rejected"]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: _one_short_session(base, i), range(SESSIONS)))
    try:
        assert [r[:2] for r in results] == [(201, 200)] * SESSIONS, [r for r in results if r[:2] != (201, 200)]
        view = wait_until(lambda: (v := cluster_view(base))["pressure"]["sessions"] == SESSIONS and v, timeout=60)
        p = view["pressure"]
        print("pressure with", SESSIONS, "sessions:", p)
        assert p["used_frac"] < 0.1 and p["rejected"] == rejected_before and p["budget_frac"] < 1.0
        assert p["max_num_seqs"] == 64  # the replica reports its sequence slots
    finally:
        for _, _, sid in results:
            if sid:
                httpx.delete(f"{base}/v1/streams/{sid}", timeout=30)


def _at_once(call):
    """Run `call`; it must be answered before the admission deadline (a 429 after it would have
    the client retry forever)."""
    started = time.monotonic()
    try:
        return call()
    finally:
        assert time.monotonic() - started < DEADLINE_S


def test_a_request_that_can_never_fit_is_a_400_at_once_on_every_route(app):
    base, _ = app
    sdk = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=60)
    for call in (lambda: sdk.completions.create(model="stream2llm", prompt=LONG, max_tokens=8),
                 lambda: sdk.chat.completions.create(model="stream2llm", max_tokens=8,
                                                     messages=[{"role": "user", "content": LONG}]),
                 lambda: sdk.completions.create(model="stream2llm", prompt="Hi", max_tokens=4096)):
        with pytest.raises(openai.BadRequestError) as e:
            _at_once(call)
        assert e.value.status_code == 400 and e.value.code == "context_length_exceeded", e.value
    r = _at_once(lambda: httpx.post(f"{base}/v1/rag", timeout=60, json={
        "question": "q", "source": {"type": "documents", "documents": ["x"]}, "sampling": {"max_tokens": 4096}}))
    assert r.status_code == 400 and r.json()["error"] == "NeverFits", r.text
    sid = httpx.post(f"{base}/v1/streams", json={"source_type": "client"}, timeout=60).json()["session_id"]
    r = _at_once(lambda: httpx.post(f"{base}/v1/streams/{sid}/chunks", json={"text": LONG}, timeout=60))
    assert r.status_code == 400 and r.json()["error"] == "ContextLimitExceeded", r.text
    r = _at_once(lambda: httpx.post(f"{base}/v1/streams/{sid}/finish", timeout=60,
                                    json={"question": "q", "sampling": {"max_tokens": 4096}}))
    assert r.status_code == 400 and r.json()["error"] == "NeverFits", r.text
    httpx.delete(f"{base}/v1/streams/{sid}", timeout=30)
    # a prompt that fits is admitted and answered
    assert sdk.completions.create(model="stream2llm", prompt="Hello", max_tokens=4).choices[0].finish_reason
