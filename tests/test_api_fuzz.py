"""Schema-driven fuzzing of the HTTP API (schemathesis) against a live local app (tiny model).

Every operation of the ingress's own OpenAPI schema gets generated requests, valid and invalid;
operations on a session get either a random id or a session opened for the case. Checks on every
response: no 5xx, a status code the schema documents, a documented content type, and a body that
matches the documented shape (the error shapes of `pipeline.schemas`). Afterwards the app is
healthy, every session is gone and KV is back to its idle level.

CI runs a bounded, derandomized budget; a longer random run:
    STREAM2LLM_FUZZ_EXAMPLES=200 STREAM2LLM_FUZZ_RANDOM=1 scripts/test.sh tests/test_api_fuzz.py
"""

from __future__ import annotations

import os

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from hypothesis import strategies as st

from tests.pipeline_fixtures import cluster_view, serve_app, tiny_config, wait_until

pytestmark = pytest.mark.timeout(1800)

EXAMPLES = int(os.environ.get("STREAM2LLM_FUZZ_EXAMPLES", "12"))
# Small answers keep each generated request short; a larger max_tokens must be refused (413).
FUZZ_CONFIG = tiny_config(model={"answer_budget_tokens": 16},
                          limits={"session_ttl_s": 30.0, "max_queue": 4, "admission_timeout_s": 5.0,
                                  "max_chunks_per_session": 6})


@pytest.fixture(scope="module")
def base():
    with serve_app(FUZZ_CONFIG) as url:
        yield url


def _checks():
    from schemathesis.checks import (content_type_conformance, not_a_server_error,
                                     response_schema_conformance, status_code_conformance)
    return [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def _fuzz(operation, base: str, mode, checks) -> int:
    """Run `EXAMPLES` generated cases of one operation; the number of calls made."""
    calls = []

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=os.environ.get("STREAM2LLM_FUZZ_RANDOM") is None,
              suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode), live_session=st.booleans())
    def run(case, live_session):
        if case.path_parameters and "session_id" in case.path_parameters and live_session:
            case.path_parameters["session_id"] = httpx.post(f"{base}/v1/streams", json={}, timeout=60).json()["session_id"]
        calls.append(case.call_and_validate(base_url=base, checks=checks, timeout=120))

    try:
        run()
    except Unsatisfiable:  # no invalid input exists for an operation without parameters or body
        if mode.value != "negative":
            raise
    return len(calls)


def test_every_operation_under_generated_requests(base):
    import schemathesis
    from schemathesis import GenerationMode

    schema = schemathesis.openapi.from_url(f"{base}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    paths = {(op.method.upper(), op.path) for op in operations}
    assert {("POST", "/v1/rag"), ("POST", "/v1/streams/{session_id}/chunks"), ("PUT", "/v1/streams/{session_id}/context"),
            ("POST", "/v1/streams/{session_id}/finish"), ("DELETE", "/v1/streams/{session_id}"),
            ("POST", "/v1/chat/completions"), ("POST", "/v1/completions")} <= paths
    calls = {}
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            calls[f"{operation.method.upper()} {operation.path} {mode.value}"] = _fuzz(operation, base, mode, _checks())
    print(f"schemathesis calls per operation and mode: {calls}")
    assert all(count for key, count in calls.items() if key.endswith("positive")), calls
    health = httpx.get(f"{base}/healthz", timeout=30)
    assert health.status_code == 200 and health.json()["ok"], health.text
    # sessions the cases opened and left are aborted (their TTL at the latest): KV back to idle
    wait_until(lambda: all(r["sessions_active"] + r["sessions_idle"] == 0 and r["kv_blocks_used"] == 0
                           for r in cluster_view(base)["replicas"].values()), timeout=120, interval=1.0)
