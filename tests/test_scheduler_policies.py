"""Policy ordering semantics, the registry, and the incremental PolicyQueue."""

import random

import pytest

from scheduler.policies import POLICIES, UnknownPolicyError, make_policy
from scheduler.queue import PolicyQueue
from scheduler.request import RequestView


def view(seq, *, first, last=None, prompt=100, computed=0, complete=False, running=False,
         admitted=-1, outputs=0, gaps=(), preemptions=0):
    v = RequestView(f"r{seq}", seq, first, first if last is None else last, prompt,
                    complete=complete, max_output_tokens=8, num_output_tokens=outputs,
                    num_computed_tokens=computed, running=running, admitted_seq=admitted,
                    num_kv_blocks=-(-computed // 16), num_preemptions=preemptions)
    v.chunk_gaps.extend(gaps)
    return v


def ids(views):
    return [v.request_id for v in views]


def test_registry_lists_valid_names_on_a_bad_one():
    assert set(POLICIES) == {"default_vllm", "fcfs", "lcas", "mcps", "tailguard"}
    with pytest.raises(UnknownPolicyError) as info:
        make_policy("fifo")
    assert "default_vllm" in str(info.value) and "tailguard" in str(info.value)
    assert info.value.valid == sorted(POLICIES)
    assert make_policy("lcas").name == "lcas"


def test_fcfs_complete_first_by_first_arrival_idle_last():
    idle = view(0, first=0.0, computed=100)  # partial, nothing to compute
    partial = view(1, first=1.0)
    late_complete = view(2, first=3.0, complete=True)
    early_complete = view(3, first=2.0, last=9.0, complete=True)
    order = make_policy("fcfs").order([idle, partial, late_complete, early_complete])
    assert ids(order) == ["r3", "r2", "r1", "r0"]


def test_lcas_sorts_by_last_chunk_arrival():
    a = view(0, first=0.0, last=8.0, complete=True)
    b = view(1, first=5.0, last=6.0, complete=True)
    c = view(2, first=1.0, last=2.0)
    d = view(3, first=0.5, last=7.0, computed=100)  # idle
    assert ids(make_policy("lcas").order([a, b, c, d])) == ["r1", "r0", "r2", "r3"]


def test_mcps_most_computed_first_then_arrival_idle_last():
    a = view(0, first=0.0, prompt=500, computed=100)
    b = view(1, first=1.0, prompt=500, computed=300)
    c = view(2, first=2.0, prompt=500, computed=300)
    d = view(3, first=0.0, prompt=900, computed=900)  # idle, most computed
    assert ids(make_policy("mcps").order([a, b, c, d])) == ["r1", "r2", "r0", "r3"]


def test_default_vllm_running_by_admission_then_waiting_preempted_first():
    r_old = view(0, first=5.0, computed=100, running=True, admitted=1)
    r_new = view(1, first=0.0, computed=100, running=True, admitted=7)
    waiting = view(2, first=1.0)
    preempted = view(3, first=4.0, preemptions=1)
    order = make_policy("default_vllm").order([waiting, r_new, preempted, r_old])
    assert ids(order) == ["r0", "r1", "r3", "r2"]
    assert order[1] is r_new  # the most recently admitted running request is the tail of running


def test_tailguard_bands_and_idle_eviction_by_expected_next_chunk():
    complete = view(0, first=0.0, last=10.0, complete=True)
    resident_work = view(1, first=1.0, prompt=200, computed=100, running=True)
    idle_soon = view(2, first=0.0, last=9.0, computed=100, running=True, gaps=[1.0])
    idle_far = view(3, first=0.0, last=9.5, computed=100, running=True, gaps=[20.0])
    idle_new = view(4, first=9.0, computed=100, running=True)  # no gap history yet
    evicted = view(5, first=0.0, last=5.0, prompt=300)
    evicted_stale = view(6, first=1.0, last=2.0, prompt=300)  # older last chunk than r5's
    complete_evicted = view(7, first=0.0, last=1.0, prompt=400, complete=True)
    order = make_policy("tailguard").order(
        [complete_evicted, evicted, evicted_stale, idle_new, idle_far, idle_soon, resident_work, complete])
    # A resident complete request goes before an older evicted one (which needs a full recompute).
    complete.running = True
    order = make_policy("tailguard").order(order)
    assert ids(order) == ["r0", "r7", "r1", "r2", "r3", "r4", "r6", "r5"]


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_policy_queue_matches_full_sort_after_random_changes(name):
    policy, rng = make_policy(name), random.Random(1)
    views = [view(i, first=rng.random() * 10, prompt=200, computed=rng.choice([0, 100, 200]),
                  complete=rng.random() < 0.5, running=rng.random() < 0.5,
                  admitted=rng.randrange(50)) for i in range(60)]
    queue = PolicyQueue(policy)
    for v in views:
        queue.touch(v)
    for _ in range(300):
        v = rng.choice(views)
        v.num_computed_tokens = rng.choice([0, 50, 200])
        v.complete, v.running = rng.random() < 0.5, rng.random() < 0.5
        v.last_chunk_arrival = v.first_chunk_arrival + rng.random()
        queue.touch(v)
    gone = views.pop(3)
    queue.remove(gone)
    assert ids(queue.ordered()) == ids(policy.order(views))
    assert len(queue) == len(views)
