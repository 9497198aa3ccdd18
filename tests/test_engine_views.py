"""Policy views built from real `vllm.v1.request.Request` objects, driven through a streamed
session's states by vLLM's own transition code (`Scheduler._update_request_as_session`), and every
policy's key asserted in each state: new, chunk pending, idle, complete resident, complete evicted,
and idle evicted (blocked)."""

from types import SimpleNamespace

import pytest
from vllm import SamplingParams
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus, StreamingUpdate

from engine.vllm_views import OPENED_ARG, PARTIAL_TURN_ARG, SUPERSEDES_ARG, ViewBook, is_partial_turn
from scheduler.policies import POLICIES, make_policy
from scheduler.policies.tailguard import expected_next_chunk

BS = 16
PARTIAL = SamplingParams(max_tokens=1, temperature=0.0, extra_args={PARTIAL_TURN_ARG: True})
FINAL = SamplingParams(max_tokens=8, temperature=0.0)


def _request(rid: str, n: int, arrival: float, params=PARTIAL) -> Request:
    return Request(rid, list(range(n)), params, None, arrival_time=arrival, resumable=True)


def _finish_turn(request: Request) -> None:
    """What vLLM does when a turn's prefill is done: all prompt computed, one sampled token,
    then `_handle_stopped_request` leaves the session idle."""
    request.num_computed_tokens = request.num_tokens
    request.append_output_token_ids(7)
    request.status = RequestStatus.WAITING_FOR_STREAMING_REQ


def _next_turn(request: Request, n: int, arrival: float, params=PARTIAL) -> None:
    fake = SimpleNamespace(hash_block_size=BS, num_waiting_for_streaming_input=1, log_stats=False)
    update = StreamingUpdate(mm_features=None, prompt_token_ids=list(range(100, 100 + n)),
                             max_tokens=params.max_tokens, arrival_time=arrival, sampling_params=params)
    Scheduler._update_request_as_session(fake, request, update)


def _book(policy="fcfs"):
    return ViewBook(make_policy(policy), BS)


def test_states_of_a_streamed_session():
    book = _book()
    request = _request("s", 100, 10.0)
    book.open(request)
    other = _request("o", 20, 11.0, FINAL)  # a later one-shot request
    book.open(other)
    (view_s, view_o) = (book.views["s"], book.views["o"])
    book.ordered()
    # new: a partial stream with its whole first chunk to compute, not resident
    assert (view_s.seq, view_o.seq) == (0, 1)
    assert not view_s.complete and view_o.complete
    assert view_s.num_tokens_to_compute == 100 and not view_s.running
    # idle: the throwaway token is in the request but is no work
    _finish_turn(request)
    assert request.num_tokens == 101
    book.mark(request)
    book.ordered()
    assert view_s.num_tokens_to_compute == 0 and view_s.idle and view_s.running
    assert view_s.num_kv_blocks == 7
    # chunk pending: vLLM trims the throwaway and appends the chunk
    _next_turn(request, 50, 12.5)
    book.chunk(request, 12.5)
    book.ordered()
    assert request.num_prompt_tokens == 150 and view_s.num_tokens_to_compute == 50
    assert view_s.first_chunk_arrival == 10.0 and view_s.last_chunk_arrival == 12.5
    assert view_s.chunk_gaps == [2.5] and view_s.seq == 0 and view_s.running
    # complete, resident: the question's turn carries no partial mark
    _finish_turn(request)
    _next_turn(request, 10, 14.0, FINAL)
    book.chunk(request, 14.0)
    book.ordered()
    assert not is_partial_turn(request) and view_s.complete
    assert view_s.num_tokens_to_compute == 10 and view_s.max_output_tokens == 8 and view_s.running
    # complete, evicted
    request.num_computed_tokens = 0
    request.num_preemptions = 1
    book.mark(request)
    book.ordered()
    assert not view_s.running and view_s.num_tokens_to_compute == 160 and view_s.num_preemptions == 1


def _session_in(state: str, book: ViewBook, seq_arrival: float = 10.0) -> Request:
    request = _request(state, 100, seq_arrival)
    book.open(request)  # vLLM's first sight of the request opens the session
    book.mark(request)
    if state == "new":
        return request
    _finish_turn(request)
    if state == "idle":
        return request
    if state == "idle_evicted":
        request.num_computed_tokens = 0
        return request
    _next_turn(request, 50, seq_arrival + 2.0, PARTIAL if state == "chunk_pending" else FINAL)
    book.chunk(request, seq_arrival + 2.0)
    if state == "complete_evicted":
        request.num_computed_tokens = 0
    return request


STATES = ("new", "chunk_pending", "idle", "idle_evicted", "complete_resident", "complete_evicted")
EXPECTED_KEYS = {  # (policy, state) -> key without the trailing seq
    "fcfs": {"new": (0, True, 10.0), "chunk_pending": (0, True, 10.0), "idle": (1, True, 10.0),
             "idle_evicted": (1, True, 10.0), "complete_resident": (0, False, 10.0),
             "complete_evicted": (0, False, 10.0)},
    "lcas": {"new": (0, True, 10.0), "chunk_pending": (0, True, 12.0), "idle": (1, True, 10.0),
             "idle_evicted": (1, True, 10.0), "complete_resident": (0, False, 12.0),
             "complete_evicted": (0, False, 12.0)},
    "mcps": {"new": (0, 0, 10.0), "chunk_pending": (0, -100, 10.0), "idle": (1, -100, 10.0),
             "idle_evicted": (1, 0, 10.0), "complete_resident": (0, -100, 10.0),
             "complete_evicted": (0, 0, 10.0)},
    "tailguard": {"new": (4, 10.0), "chunk_pending": (2, 12.0), "idle": (3, float("inf")),
                  "idle_evicted": (5, 10.0), "complete_resident": (0, 12.0),
                  "complete_evicted": (1, 12.0)},
    "default_vllm": {"new": (1, 1, 10.0), "chunk_pending": (0, -1), "idle": (0, -1),
                     "idle_evicted": (1, 1, 10.0), "complete_resident": (0, -1),
                     "complete_evicted": (1, 1, 10.0)},
}


@pytest.mark.parametrize("name", sorted(POLICIES))
@pytest.mark.parametrize("state", STATES)
def test_every_policy_key_in_every_state(name, state):
    book = _book(name)
    _session_in(state, book)
    book.ordered()
    view = book.views[state]
    assert book.key(state) == (False, *EXPECTED_KEYS[name][state], view.seq)
    assert view.blocked == (state == "idle_evicted")


def test_tailguard_idle_band_uses_the_streams_own_gaps():
    book = _book("tailguard")
    request = _request("s", 100, 10.0)
    book.open(request)
    _finish_turn(request)
    _next_turn(request, 50, 13.0)
    book.chunk(request, 13.0)
    _finish_turn(request)
    book.mark(request)
    book.ordered()
    view = book.views["s"]
    assert book.key("s") == (False, 3, 16.0, 0) and expected_next_chunk(view) == 16.0


def test_finished_requests_leave_no_view_and_order_is_stable():
    book = _book("fcfs")
    requests = [_request(f"r{i}", 10 + i, 5.0, FINAL) for i in range(5)]
    for request in requests:
        book.open(request)
    assert [v.request_id for v in book.ordered()] == [f"r{i}" for i in range(5)]  # same arrival: seq
    for request in requests[:3]:
        book.close(request.request_id)
    assert len(book) == 2 and [v.request_id for v in book.ordered()] == ["r3", "r4"]
    book.mark(requests[0])  # a late mark for a finished request is ignored
    assert [v.request_id for v in book.ordered()] == ["r3", "r4"]


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_superseded_request_ranks_last_under_every_policy(policy):
    """An update's replacement names the request it replaces by the front end's id (vLLM appends a
    random suffix to the scheduler's copy): from then on the replaced one ranks after every live
    request, so the replacement can evict it (found by the state machine test: otherwise both
    waited for memory forever)."""
    book = _book(policy)
    old = _request("s2l-old-1a2b3c4d", 100, 10.0)
    other = _request("s2l-other-9f8e7d6c", 50, 11.0)
    for request in (old, other):
        book.open(request)
        _finish_turn(request)
        book.mark(request)
    replacement = _request("s2l-new-5e6f7a8b", 40, 12.0, SamplingParams(
        max_tokens=1, temperature=0.0, extra_args={PARTIAL_TURN_ARG: True, OPENED_ARG: 10.0, SUPERSEDES_ARG: "s2l-old"}))
    book.open(replacement)
    order = [v.request_id for v in book.ordered()]
    assert book.views["s2l-old-1a2b3c4d"].superseded and order[-1] == "s2l-old-1a2b3c4d"
    assert not book.views["s2l-other-9f8e7d6c"].superseded
    book.close("s2l-old-1a2b3c4d")
    assert not book._by_client_id.get("s2l-old")  # no entry outlives its request


def test_a_parked_session_is_put_aside_until_a_full_refresh_or_its_next_chunk():
    """`refresh_queued(parked)` (the plug-in's fast path) leaves the parked requests unread;
    `refresh()` (the planner's) reads them, and so does their next chunk."""
    book = _book("tailguard")
    request = _request("s", 100, 10.0)
    book.open(request)
    book.ordered()
    view = book.views["s"]
    _finish_turn(request)  # idle now: vLLM parks it
    book.mark(request)
    book.refresh_queued({"s"})
    assert view.num_tokens_to_compute == 100 and not view.running  # not read yet
    book.refresh_queued({"s"})  # still aside, and not read twice either
    book.refresh()  # the planner's call reads what was put aside
    assert view.num_tokens_to_compute == 0 and view.running and view.idle
    book.mark(request)  # changed again while parked: put aside again
    book.refresh_queued({"s"})
    _next_turn(request, 50, 12.5)  # its next chunk: back in a queue, read at the next step
    book.chunk(request, 12.5)
    book.refresh_queued(set())
    assert view.num_tokens_to_compute == 50 and view.last_chunk_arrival == 12.5
    assert book.key("s")[1] == 2  # TailGuard: resident partial stream with work
    book.close("s")
    assert not book._dirty and not book._put_aside


def test_the_fast_path_keys_are_fresh_and_the_planners_order_catches_up():
    """`refresh_queued` reads changed requests without moving them in the policy's order: `key`
    gives their fresh key (vLLM's queues are sorted by it), and `ordered()` (the planner's) files them."""
    book = _book("tailguard")
    first, second = _request("a", 100, 10.0), _request("b", 100, 11.0)
    for request in (first, second):
        book.open(request)
    assert [v.request_id for v in book.ordered()] == ["a", "b"]  # both non-resident with work
    second.num_computed_tokens = 16  # "b" now holds KV: a resident partial stream ranks first
    book.mark(second)
    book.refresh_queued(set())
    assert book.key("b") < book.key("a")
    assert [v.request_id for v in book.ordered()] == ["b", "a"]
    assert book.key("b") < book.key("a")
