"""Restart drill of the central scheduler actor under a running app (tiny model, one replica).

Sessions are open with context on the replica when the central actor is killed (Ray restarts it:
`max_restarts=-1`). Every session, those open across the restart and those opened while it comes
back, ends answered or rejected with 429 + Retry-After: none lost, none failed. The restarted actor
rebuilds placements from the replica's next report, and the cluster view returns to no sessions.
"""

import threading

import httpx
import pytest
import ray

from pipeline_fixtures import cluster_view, parse_sse, serve_app, tiny_config, wait_until

pytestmark = pytest.mark.timeout(600)

CONFIG = tiny_config(replicas={"min_replicas": 1, "max_replicas": 1, "num_cpus": 0.5},
                     limits={"max_queue": 8, "admission_timeout_s": 30.0, "session_ttl_s": 120.0})
BEFORE, DURING = 3, 4


def open_with_context(c: httpx.Client, i: int):
    r = c.post("/v1/streams", json={"source_type": "client"})
    if r.status_code == 429:
        return ("rejected", r.headers.get("retry-after"))
    assert r.status_code == 201, r.text
    sid = r.json()["session_id"]
    r = c.post(f"/v1/streams/{sid}/chunks", json={"text": f"fact {i}: the sky is blue. " * 10, "source_id": f"d{i}"})
    assert r.status_code == 200, r.text
    return ("open", sid)


def finish(c: httpx.Client, sid: str):
    r = c.post(f"/v1/streams/{sid}/finish", json={"question": "What colour?", "sampling": {"max_tokens": 4}})
    events = parse_sse(r.text) if r.status_code == 200 else []
    ok = events and events[-1][0] == "final" and any(name == "token" for name, _ in events)
    return ("answered",) if ok else ("failed", r.status_code, r.text[-300:])


def session_flow(base: str, out: list, i: int):
    with httpx.Client(base_url=base, timeout=120) as c:
        state = open_with_context(c, i)
        out[i] = finish(c, state[1]) if state[0] == "open" else state


def test_central_actor_restart_loses_no_session():
    with serve_app(CONFIG) as base:
        baseline_kv = sum(r["kv_blocks_used"] for r in cluster_view(base)["replicas"].values())
        central = ray.get_actor("stream2llm_scheduler", namespace="stream2llm")
        started = ray.get(central.ping.remote())["started_at"]
        with httpx.Client(base_url=base, timeout=120) as c:
            opened = [open_with_context(c, i) for i in range(BEFORE)]
        assert all(kind == "open" for kind, _ in opened)
        ray.kill(central, no_restart=False)
        results: list = [None] * DURING
        threads = [threading.Thread(target=session_flow, args=(base, results, i)) for i in range(DURING)]
        for t in threads:
            t.start()
        wait_until(lambda: _restarted(central, started), timeout=120)
        # the restarted actor adopts the sessions the replica still lists in its reports
        sids = [sid for _, sid in opened]
        wait_until(lambda: all(ray.get(central.lookup.remote(s)) for s in sids), timeout=60)
        with httpx.Client(base_url=base, timeout=120) as c:
            before = [finish(c, sid) for sid in sids]
        for t in threads:
            t.join(timeout=300)
        outcomes = before + results
        assert all(o is not None and o[0] in ("answered", "rejected") for o in outcomes), outcomes
        assert all(o[1] and int(o[1]) >= 1 for o in outcomes if o[0] == "rejected")
        assert all(o[0] == "answered" for o in before), before  # admitted before the restart: answered
        wait_until(lambda: cluster_view(base)["pressure"]["sessions"] == 0, timeout=60)
        wait_until(lambda: sum(r["kv_blocks_used"] for r in cluster_view(base)["replicas"].values())
                   <= baseline_kv, timeout=60)


def _restarted(central, started) -> bool:
    try:
        return ray.get(central.ping.remote(), timeout=5)["started_at"] != started
    except Exception:
        return False
