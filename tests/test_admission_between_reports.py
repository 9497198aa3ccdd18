"""Sessions placed since a replica's last report count in its real room (issue 32, cluster scale).

A placed session holds no reported blocks until a report lists it: without counting its projected
size the roomiest replica stayed the roomiest and took every session between two reports. Pure:
hand-built reports, no Ray, no vLLM.
"""

from scheduler.admission import AdmissionController, DemandModel, ReplicaReport, blocks_for

BLOCKS, BLOCK = 4096, 32
PRIOR = 2048                        # client sessions' projected size before any has finished
ROOM = BLOCKS - int(BLOCKS * 0.05)  # the real room of an empty replica (5% reserve)
SIZE = blocks_for(PRIOR, BLOCK)     # 64 blocks


def report(rid="a", used=0, sessions=None):
    sessions = sessions or {}
    return ReplicaReport(rid, BLOCKS, used, BLOCK, sessions=sessions,
                         source_types={s: "client" for s in sessions}, max_num_seqs=64)


def controller():
    return AdmissionController(DemandModel({"client": PRIOR}), max_queue=16, stale_after_s=5.0,
                               reserve_frac=0.05, overcommit=2.0)


def test_placements_between_reports_shrink_the_real_room():
    c = controller()
    c.report(report(), now=0)
    assert c.headroom("a") == ROOM
    for i in range(3):
        assert c.try_admit(f"s{i}", "client", now=0.1) == "a"
        assert c.headroom("a") == ROOM - (i + 1) * SIZE


def test_a_report_that_lists_them_does_not_count_them_twice():
    c = controller()
    c.report(report(), now=0)
    for i in range(3):
        c.try_admit(f"s{i}", "client", now=0.1)
    c.report(report(used=3, sessions={f"s{i}": 12 for i in range(3)}), now=1)
    assert c.headroom("a") == ROOM - 3  # their reported blocks, not also their projected size
    c.report(report(used=3, sessions={f"s{i}": 12 for i in range(3)}), now=2)
    assert c.headroom("a") == ROOM - 3


def test_a_report_taken_before_a_session_opened_keeps_counting_it():
    c = controller()
    c.report(report(), now=0)
    c.try_admit("s0", "client", now=0.1)
    c.try_admit("s1", "client", now=0.1)
    c.report(report(used=1, sessions={"s0": 12}), now=1)  # s1 not open on the replica yet
    assert c.headroom("a") == ROOM - 1 - SIZE


def test_a_release_before_any_report_restores_the_room():
    c = controller()
    c.report(report(), now=0)
    c.try_admit("s0", "client", now=0.1)
    c.try_admit("s1", "client", now=0.1)
    c.release("s0")
    assert c.headroom("a") == ROOM - SIZE
    c.release("s1")
    assert c.headroom("a") == ROOM
    c.report(report(), now=1)
    assert c.headroom("a") == ROOM


def test_sessions_spread_over_equal_replicas_between_two_reports():
    c = controller()
    for rid in "abcd":
        c.report(report(rid), now=0)
    placed = [c.try_admit(f"s{i}", "client", now=0.1) for i in range(40)]
    assert sorted(placed.count(rid) for rid in "abcd") == [10, 10, 10, 10]


def test_the_real_room_still_refuses_once_unreported_sessions_fill_it():
    c = controller()
    c.report(report(), now=0)
    placed = 0
    while c.try_admit(f"s{placed}", "client", now=0.1) is not None:
        placed += 1
    assert placed == ROOM // SIZE  # 60: each of them may prefill its whole projection before a report
    c.report(report(used=placed, sessions={f"s{i}": 12 for i in range(placed)}), now=1)
    assert c.try_admit("late", "client", now=1) == "a"  # real use is low: the next report frees the room
