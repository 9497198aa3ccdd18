"""The plug-in's per-step shortcuts decide what the plain computation would: over random streams,
questions and steps on a real vLLM scheduler (no model), the cached keys vLLM's queues are sorted
by equal each request's fresh policy key, the queues come out in the order of a full sort by fresh
keys, and the early-prefill allowance read from `ViewBook.clocks` equals the walk over every
queued view."""

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.vllm_scheduler import StreamingScheduler
from engine.vllm_step_blocks import free_for_planner
from scheduler.policies import POLICIES
from tests.sched_harness import Driver, final, make_scheduler

ACTIONS = st.lists(st.tuples(st.integers(0, 7), st.sampled_from(["chunk", "question", "step"]),
                             st.integers(1, 120)), min_size=5, max_size=40)


def _fresh_key(s, request) -> tuple:
    view = s.book.views[request.request_id]
    return (view.superseded, *s.stream_policy.sort_key(view))


def _reference_key(s, request) -> tuple:
    """The order's definition: superseded requests last, then the policy's key (nested, unflattened)."""
    view = s.book.views[request.request_id]
    return (view.superseded, s.stream_policy.sort_key(view))


def _check(s) -> None:
    """Before the plug-in plans: what its shortcuts give equals the plain computation."""
    s.book.refresh_queued(s.parked)
    queues = (s.running, s.kv_holding_waiting, s.waiting)
    key = s.book.sort_keys()
    for queue in queues:
        for request in queue:
            assert key(request) == _fresh_key(s, request)
            assert s.book.work[request] == s.book.views[request.request_id].num_tokens_to_compute
    free = free_for_planner(s)
    views = [s.book.views[r.request_id] for queue in queues for r in queue]
    assert s._early_allowance(free) == s.step_budget.early_allowance(views, free)
    s._order_queues()
    for queue in queues:
        assert list(queue) == sorted(queue, key=lambda r: _reference_key(s, r))


@settings(max_examples=15, deadline=None)
@given(policy=st.sampled_from(sorted(POLICIES)), actions=ACTIONS)
def test_shortcuts_equal_the_full_computation(policy, actions):
    s = make_scheduler(StreamingScheduler, policy, num_blocks=96, max_num_seqs=4, budget=128)
    d = Driver(s)
    real, checked = s.plan_and_apply, []

    def checked_plan() -> None:
        _check(s)
        checked.append(1)
        real()

    s.plan_and_apply = checked_plan
    asked: set[str] = set()
    for session, action, tokens in actions:
        rid = f"s{session}"
        if rid in asked or rid in d.finished:
            continue
        if action == "step":
            d.step()
        elif action == "question":
            d.turn(rid, tokens % 40 + 1, final(2), resumable=False)
            asked.add(rid)
        else:
            d.turn(rid, tokens)
    for _ in range(30):
        d.step()
    assert checked  # the plan ran, and was checked, at least once
