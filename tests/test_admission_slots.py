"""Pure tests of admission slots: placements decided ahead for a caller, taken without a round trip."""

from scheduler.admission import AdmissionController, DemandModel, ReplicaReport


def report(rid, used=0, total=100, sessions=None):
    return ReplicaReport(rid, total, used, 16, sessions=sessions or {}, source_types={})


def controller():
    return AdmissionController(DemandModel({"vector": 16 * 10}), max_queue=2, stale_after_s=5.0)


def test_slots_take_at_most_half_of_a_replicas_free_room():
    c = controller()
    c.report(report("a"), now=0)
    slots = c.grant_slots("ingress-1", "vector", 100, now=0, ttl_s=2.0)
    assert [replica for _, replica in slots] == ["a"] * 5 and len({slot for slot, _ in slots}) == 5
    assert c.headroom("a") == 50  # 100 free blocks, 10 per session: half went to slots
    assert c.try_admit("plain", "vector", now=0) == "a"  # the other half is there for everybody
    assert c.grant_slots("ingress-2", "vector", 100, now=0, ttl_s=2.0) == []  # 40 left < (2 + 5) x 10


def test_a_bound_slot_becomes_the_sessions_placement_and_its_release_frees_it():
    c = controller()
    c.report(report("a"), now=0)
    (slot, replica), = c.grant_slots("ingress-1", "vector", 1, now=0, ttl_s=2.0)
    c.bind_slot(slot, "s1", replica, "vector", now=0.1)
    assert c.placement("s1").replica_id == "a" and c.projected_used("a") == 10
    assert c.session_count() == 1  # the slot's placement is gone, the session's took its room
    # the session outlives the slot's lease: bound, it is a session like any other
    c.report(report("a", sessions={"s1": 160}), now=5.0)
    assert c.placement("s1").replica_id == "a"
    c.release("s1")
    assert c.headroom("a") == 100 and c.session_count() == 0


def test_no_slots_while_anybody_waits_in_the_queue():
    c = controller()
    c.report(report("a", used=95), now=0)
    assert c.try_admit("waiting", "vector", now=0) is None and c.enqueue("waiting", "vector", now=0)
    c.report(report("a", used=0), now=1)  # room again, but the queued session goes first
    assert c.grant_slots("ingress-1", "vector", 4, now=1, ttl_s=2.0) == []
    assert c.drain(now=1) == {"waiting": "a"}
    assert len(c.grant_slots("ingress-1", "vector", 1, now=1, ttl_s=2.0)) == 1


def test_an_unused_slot_expires_and_a_late_binding_still_places_the_session():
    c = controller()
    c.report(report("a"), now=0)
    (slot, replica), = c.grant_slots("ingress-1", "vector", 1, now=0, ttl_s=2.0)
    c.report(report("a"), now=1.0)  # within its lease: kept although no report lists it
    assert c.headroom("a") == 90
    c.report(report("a"), now=2.5)  # past its lease: dropped, its room back
    assert c.headroom("a") == 100 and c.session_count() == 0
    assert len(c.grant_slots("ingress-1", "vector", 5, now=2.5, ttl_s=2.0)) == 5  # the slot count went too
    c.bind_slot(slot, "late", replica, "vector", now=3.0)  # the holder used it just in time
    assert c.placement("late").replica_id == "a"
    c.bind_slot("slot:unknown:1", "nowhere", "gone-replica", "vector", now=3.0)
    assert c.session_count() == 6  # 5 slots + "late"; a replica nobody knows places nothing


def test_slots_go_in_turn_like_placements():
    c = controller()
    c.report(report("a"), now=0)
    c.report(report("b", used=20), now=0)  # by room alone a would take every slot
    slots = [c.grant_slots("ingress-1", "vector", 1, now=t, ttl_s=9.0)[0] for t in (1, 2, 3, 4)]
    assert [replica for _, replica in slots] == ["a", "b", "a", "b"]
    # two at one moment: a (placed longest ago), then b (placed before the first of them)
    assert [r for _, r in c.grant_slots("ingress-2", "vector", 2, now=5, ttl_s=9.0)] == ["a", "b"]
