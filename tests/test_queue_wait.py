"""Pure tests of the full-queue decision: a full admission queue still takes an ask that the queue's
recent drain rate says will start within its deadline, refuses one that would not (at once), and
its Retry-After comes from the same estimate."""

import pytest

from scheduler.admission import AdmissionController, DemandModel, ReplicaReport
from scheduler.admission_queue import OVERFLOW
from scheduler.queue_wait import QueueWait


def test_no_estimate_until_enough_sessions_left_the_queue():
    w = QueueWait(window_s=30.0, min_events=3)
    w.note(0.0)
    w.note(1.0)
    assert w.wait_s(1, now=2.0) is None
    assert w.retry_after_s(1, now=2.0, fallback_s=7.0) == 7
    w.note(2.0)
    assert w.per_s(now=4.0) == pytest.approx(3 / 4.0)
    assert w.wait_s(3, now=4.0) == pytest.approx(4.0)
    assert w.per_s(now=40.0) is None  # all out of the window


def full_controller(max_queue=2):
    """One replica with room for 4 sessions (25 blocks each), all taken, `max_queue` waiting."""
    c = AdmissionController(DemandModel({"vector": 16 * 25}), max_queue=max_queue, stale_after_s=1e9)
    c.report(ReplicaReport("a", 100, 0, 16), now=0)
    for i in range(4):
        assert c.try_admit(f"s{i}", "vector", now=0) == "a"
    for i in range(max_queue):
        assert c.enqueue(f"q{i}", "vector", now=0)
    return c


def drain_one_per_second(c, start, count, first):
    """Release one placed session per second; the queue's head takes its room."""
    for k in range(count):
        c.release(f"s{first + k}" if first + k < 4 else f"q{first + k - 4}")
        assert len(c.drain(now=start + k)) == 1


def test_a_full_queue_refuses_at_once_without_a_drain_rate():
    c = full_controller()
    assert not c.enqueue("late", "vector", now=1, deadline_s=60.0)
    assert c.rejected == 1
    assert c.retry_after_s(now=1) == 3  # no estimate: one second per session waiting, plus one


def test_a_full_queue_takes_what_starts_in_time_and_refuses_the_rest():
    c = full_controller(max_queue=2)
    drain_one_per_second(c, start=1, count=2, first=0)  # q0, q1 placed at t=1, 2
    c.enqueue("q2", "vector", now=2.5)
    c.enqueue("q3", "vector", now=2.5)
    c.release("s2")
    assert c.drain(now=3) == {"q2": "a"}  # 3 drained over 2 s: 1.5 per second; q3 waits
    # queue full (q3 and one more); a third joiner would stand 3rd: ~2 s at 1.5/s
    assert c.enqueue("q4", "vector", now=3)
    assert not c.enqueue("too_soon", "vector", now=3, deadline_s=1.0)
    assert c.enqueue("in_time", "vector", now=3, deadline_s=5.0)
    assert not c.enqueue("no_deadline", "vector", now=3)
    assert c.queued() == 3 and c.rejected == 2
    assert c.retry_after_s(now=3) == 3  # 4th in line at 1.5 per second: 2.7 s


def test_overflow_is_bounded():
    c = full_controller(max_queue=1)  # q0 waits
    for t, (gone, joins) in enumerate((("s0", "a"), ("s1", "b"), ("s2", None)), start=1):
        c.release(gone)
        assert len(c.drain(now=t)) == 1  # q0, a, b placed at t = 1, 2, 3
        if joins:
            assert c.enqueue(joins, "vector", now=t)
    assert c.enqueue("c", "vector", now=3)  # the queue holds max_queue (1) now
    joined = sum(c.enqueue(f"o{i}", "vector", now=3, deadline_s=1e9) for i in range(3 * OVERFLOW))
    assert joined == OVERFLOW - 1 and c.queued() == OVERFLOW
