"""Pure tests of the projection audit: projected final sizes against the sizes sessions ended with."""

from scheduler.admission import AdmissionController, DemandModel, ReplicaReport
from scheduler.projection_audit import FinalSizes, audit_point


def test_audit_compares_only_sessions_with_a_known_end():
    point = audit_point({"a": 10, "b": 4, "c": 7}, {"a": 16 * 8, "b": 16 * 4 + 1}, capacity_blocks=100,
                        block_size=16, sources={"a": "crawler", "b": "client", "c": "crawler"})
    assert (point.projected_blocks, point.real_blocks) == (14, 13)  # 8 + 5 (a part block counts whole)
    assert point.excess_by_source == {"crawler": 2, "client": -1}
    assert (point.sessions, point.unresolved) == (2, 1)
    assert abs(point.error - 0.01) < 1e-9


def test_final_sizes_keep_the_last_ones():
    finals = FinalSizes(limit=2)
    for sid, tokens in (("a", 1), ("b", 2), ("c", 3)):
        finals.add(sid, tokens)
    assert finals.get(["a", "b", "c"]) == {"b": 2, "c": 3}


def test_controller_projects_sessions_and_records_what_they_ended_with():
    c = AdmissionController(DemandModel({"vector": 16 * 10}), stale_after_s=50.0)
    c.report(ReplicaReport("r", 100, 0, 16), now=0)
    c.try_admit("s", "vector", now=0)
    c.try_admit("q", "oneshot", now=0, tokens=16 * 3, lease_s=60.0)
    assert c.projections("r") == {"s": 10, "q": 3}
    assert c.source_types("r") == {"s": "vector", "q": "oneshot"}
    c.release("s", 16 * 6)
    c.release("q", 40)
    assert c.finals.get(["s", "q"]) == {"s": 96, "q": 40}
    assert c.demand.observations == {"vector": 1}  # a lease's size teaches no session type
