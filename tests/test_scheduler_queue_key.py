"""The flat queue key orders exactly as its definition: over random views (ties, superseded
requests, every band of every policy), a plain `sorted()` by `(superseded, policy.sort_key(view))`
gives the same order as `sorted()` by `queue_key`, and the incremental `PolicyQueue`, after random
changes and touches, lists its views in that same order."""

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.policies import POLICIES, make_policy
from scheduler.queue import PolicyQueue, queue_key
from scheduler.request import RequestView

TIMES = st.sampled_from([0.0, 1.0, 2.5, 7.0])  # few values: ties on every time field
FIELDS = st.fixed_dictionaries({
    "first": TIMES, "later": TIMES, "prompt": st.integers(1, 300), "computed": st.integers(0, 300),
    "outputs": st.integers(0, 3), "max_outputs": st.integers(1, 3), "complete": st.booleans(),
    "running": st.booleans(), "blocked": st.booleans(), "superseded": st.booleans(),
    "admitted": st.integers(-1, 3), "preemptions": st.integers(0, 2),
    "gaps": st.lists(st.sampled_from([0.5, 3.0]), max_size=2)})


def _view(seq: int, f: dict) -> RequestView:
    view = RequestView(f"r{seq}", seq, f["first"], f["first"] + f["later"], f["prompt"])
    _apply(view, f)
    return view


def _apply(view: RequestView, f: dict) -> None:
    view.last_chunk_arrival = view.first_chunk_arrival + f["later"]
    view.num_prompt_tokens, view.num_computed_tokens = f["prompt"], min(f["computed"], f["prompt"])
    view.num_output_tokens, view.max_output_tokens = f["outputs"], f["max_outputs"]
    view.complete, view.running, view.blocked = f["complete"], f["running"], f["blocked"]
    view.superseded, view.admitted_seq, view.num_preemptions = f["superseded"], f["admitted"], f["preemptions"]
    view.chunk_gaps[:] = f["gaps"]


def _reference(policy, views) -> list[RequestView]:
    return sorted(views, key=lambda v: (v.superseded, policy.sort_key(v)))


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(sorted(POLICIES)), fields=st.lists(FIELDS, min_size=1, max_size=30))
def test_the_flat_key_orders_as_the_nested_pair(name, fields):
    policy = make_policy(name)
    views = [_view(seq, f) for seq, f in enumerate(fields)]
    assert sorted(views, key=queue_key(policy)) == _reference(policy, views)


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(sorted(POLICIES)), fields=st.lists(FIELDS, min_size=1, max_size=20),
       changes=st.lists(st.tuples(st.integers(0, 19), FIELDS), max_size=30))
def test_the_incremental_queue_lists_the_plain_sort(name, fields, changes):
    policy = make_policy(name)
    views = [_view(seq, f) for seq, f in enumerate(fields)]
    queue = PolicyQueue(policy)
    for view in views:
        queue.touch(view)
    for at, f in changes:
        view = views[at % len(views)]
        _apply(view, f)
        queue.touch(view)
        assert queue.key_of(view) == queue_key(policy)(view)
    assert queue.ordered() == _reference(policy, views)
