"""Pure tests of where the central scheduler places sessions: in turn while replicas have KV to
spare, by most room once they do not, and never on a replica too small for the session."""

from scheduler.admission import AdmissionController, DemandModel, ReplicaReport
from scheduler.replica_index import ROOMY_FRAC


def report(rid, used=0, total=100, bs=16):
    return ReplicaReport(rid, total, used, bs)


def controller():
    return AdmissionController(DemandModel({"vector": 16 * 2, "big": 16 * 60}), max_queue=4,
                               stale_after_s=50.0, overcommit=2.0)


def test_roomy_replicas_take_sessions_in_turn_not_by_room():
    c = controller()
    for rid, used in (("a", 0), ("b", 30), ("c", 50)):  # all with at least ROOMY_FRAC free
        c.report(report(rid, used=used), now=0)
    assert 1 - 50 / 100 >= ROOMY_FRAC
    placed = [c.try_admit(f"s{i}", "vector", now=1 + i) for i in range(6)]
    # by room alone "a" would take them all (each takes 2 of its 100 blocks)
    assert placed[:3] == ["a", "b", "c"]  # never placed yet: most room first
    assert placed[3:] == ["a", "b", "c"]  # then the least recently placed


def test_replicas_short_of_room_go_by_most_room_after_the_roomy_ones():
    c = controller()
    c.report(report("a", used=90), now=0)
    c.report(report("b", used=80), now=0)
    c.report(report("c", used=40), now=0)
    assert c.try_admit("s1", "vector", now=1) == "c"
    assert c.try_admit("s2", "vector", now=2) == "c"  # still roomy, and the only one
    c.report(report("c", used=96), now=3)
    assert c.try_admit("s3", "vector", now=4) == "b"  # none roomy now: most room (b 20, a 10, c 4)


def test_a_session_too_big_for_the_next_in_turn_goes_to_the_roomiest():
    c = controller()
    c.report(report("a", used=0), now=0)
    c.report(report("b", used=30), now=0)
    assert c.try_admit("s1", "vector", now=1) == "a"
    # b is next in turn (never placed) but has 70 blocks free: the big session (60 blocks) fits
    # there too; with b at 50 used it does not, and a (98 free) takes it.
    c.report(report("b", used=50), now=2)
    assert c.try_admit("big1", "big", now=3) == "a"


def test_both_heaps_stay_bounded_when_only_one_is_asked():
    c = controller()
    for rid in "abcd":
        c.report(report(rid), now=0)
    for i in range(2000):  # every placement pushes onto both heaps; only the turn heap is read here
        assert c.try_admit(f"s{i}", "vector", now=1 + i / 100) is not None
        c.release(f"s{i}")
    index = c._index
    assert max(len(index._heap), len(index._by_room)) <= 4 * len(index.replicas) + 64 + 1
