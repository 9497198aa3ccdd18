"""`bench.reliability` on a small load: real Ray + Serve on loopback, tiny model.

Eight sessions of mixed sources (inline documents, corpus ids, crawler and vector trace replays),
one client set to leave mid-retrieval and one mid-answer, one engine replica killed under the load
(the replica holding the most sessions, once both report) and one of the two ingress replicas killed
3 s in. Asserted: every offered session is accounted for, none is lost, none failed, a disconnect
happened (a leaver refused with 429 asks again, up to 3 times), Serve's controller dropped the
killed replica from its running replicas (the list routers follow) and each ingress's router stopped
routing to it, and the cluster drains (no session left anywhere, KV back to idle). Two fixed engine
replicas. History of the ingress-kill drill here: it was out of CI for a while (3 failures in
about 14 runs at first, later 2 in 8 and 1 in 8: a session failed, whose error was cut short; an
ingress reported still listing the dead engine replica, in a later such run the killed ingress
itself, now reported "ingress gone"; both leavers refused with 429, so none left: leavers now ask
again). With the routers' own liveness check (`pipeline/control/router.py`) it passed 14 runs in a row;
of 18 more, one failed: a recovery replayed its context to the replica it was placed on while its
open had landed on another (`EngineClient.recover`, fixed); the 8 runs after that fix passed, and
5 more after the router fix (`pipeline/control/router.py`: an open's wait no longer spins its event loop).
CI at 6005c10 failed on a double fault: a session's answer had begun on the engine replica the
drill killed, and its ingress was the one killed; its resume through the other ingress was answered
404 `SessionGone` (no process held the session any more). A user asks again then, and so does the
drill's client now (`must_ask_again`). Ingress kills are also tested deterministically in
tests/test_pipeline_ingress.py. How fast the controller drops a replica is a
benchmark figure (`python -m bench.reliability`: `kill.dropped_by_controller_s`, and per ingress
router `kill.left_routers_s`), not asserted here.
"""

import json

import pytest

from bench.reliability import LoadSpec, plan_sessions, run
from bench.reliability_sessions import is_lost, must_ask_again, outcome
from pipeline.run.rag_client import RagResult

pytestmark = pytest.mark.timeout(300)


def test_outcomes_and_lost_are_classified_from_the_result():
    answered = RagResult("q", "stream", status=200, final={"citations": []})
    assert outcome(answered, False) == "answered" and not is_lost(answered)
    assert outcome(RagResult("q", "stream", status=429, error="AdmissionRejected: full"), False) == "rejected"
    error_event = RagResult("q", "stream", status=200, error="EngineError: boom")
    assert outcome(error_event, False) == "failed" and not is_lost(error_event)
    cut = RagResult("q", "stream", status=200, error="the stream ended without a final event")
    timeout = RagResult("q", "stream", status=0, error="ReadTimeout: timed out")
    assert is_lost(cut) and is_lost(timeout)
    # lost is its own outcome, not a part of failed
    assert outcome(cut, False) == "lost" and outcome(timeout, False) == "lost"
    assert outcome(RagResult("q", "stream"), False, timed_out=True) == "lost"
    assert outcome(cut, True) == "disconnected"


def test_a_user_asks_again_only_when_no_attempt_can_go_on():
    cut_before = RagResult("q", "stream", status=200, error="RemoteProtocolError: peer closed")
    by_proxy = RagResult("q", "stream", status=500, error="Internal Server Error", ingresses=[""])
    assert must_ask_again(cut_before) and must_ask_again(by_proxy)
    # resumed, and the replica that held the answer is gone too (its ingress died first)
    answer_lost = RagResult("q", "stream", status=404, error="SessionGone: no answer", last_event_id="s.r1.3",
                            resumed=1, ingresses=["a", "b"])
    lost_during_resume = RagResult("q", "stream", status=200, error="SessionGone: lost with its replica",
                                   last_event_id="s.r1.5", resumed=1)
    assert must_ask_again(answer_lost) and must_ask_again(lost_during_resume)
    # answers of the service: not asked again
    assert not must_ask_again(RagResult("q", "stream", status=404, error="SessionGone: x", ingresses=["a"]))
    assert not must_ask_again(RagResult("q", "stream", status=500, error="EngineError: x", ingresses=["a"]))
    assert not must_ask_again(RagResult("q", "stream", status=429, error="AdmissionRejected: full"))
    error_event = RagResult("q", "stream", status=200, error="AnswerNotReproducible: x", last_event_id="s.r1.3",
                            resumed=1)
    assert not must_ask_again(error_event)
    assert not must_ask_again(RagResult("q", "stream", status=200, final={"citations": []}, last_event_id="s.r1.3"))


def test_plan_mixes_sources_and_disconnect_roles(tmp_path):
    plans = plan_sessions(LoadSpec(sessions=8, duration_s=8.0), tmp_path)
    assert {p.kind for p in plans} == {"documents", "corpus", "crawler", "vector"}
    assert [p.at_s for p in plans] == sorted(p.at_s for p in plans)
    leavers = {p.leave_on for p in plans if p.leave_on}
    assert leavers == {"context", "token"}
    assert all(p.source["type"] == "trace" for p in plans if p.leave_on == "context")
    assert all((tmp_path / p.source["trace"]).is_file() for p in plans if p.source["type"] == "trace")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    spec = LoadSpec(sessions=8, duration_s=8.0, min_replicas=2, max_replicas=2, drain_timeout_s=20.0, kill=True,
                    kill_deadline_s=4.0, ingress_replicas=2, kill_ingress_at_s=3.0)
    return run(spec, tmp_path_factory.mktemp("traces"))


def test_every_session_is_accounted_for_and_none_lost(report):
    c = report["counts"]
    assert c["offered"] == 8
    assert c["offered"] == c["answered"] + c["rejected"] + c["failed"] + c["lost"] + c["disconnected"]
    # a string message: pytest prints it whole (a dict is cut short), and CI keeps only this output
    assert c["lost"] == 0, json.dumps(report["failures"], default=str)
    assert c["failed"] == 0, json.dumps(report["failures"], default=str)
    # A planned leaver leaves at its first context event or token, unless it was refused first (429;
    # also after asking again when the ingress kill cut it): the disconnect path must have run.
    leavers = [r for r in report["records"] if r["leave_on"]]
    assert len(leavers) == 2 and all(r["outcome"] in ("disconnected", "rejected") for r in leavers), leavers
    assert c["disconnected"] >= 1, leavers
    assert c["answered"] >= 4
    serving = report["serving"]  # the sessions that did not leave (a leaver refused first is one)
    assert serving["completed"] == c["answered"]
    assert serving["failed"] == c["offered"] - c["disconnected"] - c["answered"]
    assert serving["median_ttft_ms"] > 0 and serving["p99_e2el_ms"] >= serving["median_e2el_ms"]


def test_killed_replica_is_dropped_by_serves_controller(report):
    assert report["ingress_kill"]["killed"] is True, report["ingress_kill"]
    kill = report["kill"]
    assert kill["killed"] is True, kill
    assert kill["dropped_by_controller_s"] is not None, kill  # dropped within 60 s
    if kill["was_routable"]:  # each ingress's router stopped routing to it (within 30 s), never
        # listed it (a router made after the kill, e.g. the one of an ingress that replaced another),
        # or went with its ingress (killed before it let go)
        left = kill["left_routers_s"]
        assert left and all(isinstance(s, float) or s in ("never listed", "ingress gone")
                            for s in left.values()), kill
    # Whether a session was still open on the victim depends on timing (the count it was chosen by is
    # up to a report interval old), so recovery is not asserted here: none lost and none failed
    # (above) is; tests/test_pipeline_http.py checks a recovery after a kill deterministically.
    print("kill drill:", kill, "recovered:", report["recovered"])


def test_cluster_drains_after_the_load(report):
    leaks = report["leaks"]
    assert leaks["drained"] is True, leaks
    assert leaks["replica_sessions"] == leaks["ingress_sessions"] == leaks["scheduler_sessions"] == 0
    assert report["memory_mb"]["ray_peak"] > 0 and report["replicas"]["running_max"] >= 2
