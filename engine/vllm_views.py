"""Policy views of vLLM requests: one `RequestView` per live request, kept up to date incrementally.

What a view says, read from vLLM 0.32's `Request` (`vllm/v1/request.py`) and its streaming-input
session path (`Scheduler._handle_stopped_request`, `_update_request_as_session`):

- `seq` and `first_chunk_arrival` are fixed when vLLM first sees the request (the session's first
  chunk opens it): a stable order that later chunks never reshuffle. A request that takes over
  from an earlier one of the same session (after a `replace`) carries the session's opening time in
  `OPENED_ARG` and keeps that first arrival, so it keeps its place in first-arrival orders; it
  names the request it replaces in `SUPERSEDES_ARG`, which from then on ranks last (it is kept
  only so that its prefix blocks can be shared, and it shares the session's rank: were it not
  ranked last, the replacement could never evict it and both would wait for memory forever).
- `last_chunk_arrival` and `chunk_gaps` follow every later chunk (vLLM stamps each streaming update
  with its own arrival time).
- `complete` is true once the final turn has arrived, served now or queued in the request's
  `streaming_queue` behind a context turn: our streamed sessions mark every prefill-only turn with
  `PARTIAL_TURN_ARG` in its sampling parameters' `extra_args`; the question's turn (and any plain
  one-shot request) carries no mark.
- A partial turn's work is its prompt only. vLLM samples one throwaway token at the end of every
  turn and trims it when the next chunk comes; until then it sits in the request's token list but
  is never computed, so an idle stream (`WAITING_FOR_STREAMING_REQ`, all prompt tokens computed)
  shows zero work. An idle stream whose KV was evicted is `blocked`: it cannot run before its next
  chunk.
- Under async scheduling (vLLM's `AsyncScheduler`, the GPU default) the next step is scheduled
  before the last one's output is back: `num_computed_tokens` already counts the tokens in flight,
  and the tokens they will sample are `num_output_placeholders`. vLLM's work for a request is
  `num_tokens + num_output_placeholders - num_computed_tokens`, so placeholders count as output
  here too: a decode (or a question just after its prefill) shows its one token of work, not
  zero, and one whose in-flight samples reach `max_tokens` shows none (vLLM does not schedule it).
  Their sum with the sampled tokens does not change when the output arrives, so the view stays
  true without a re-read then. A partial turn's placeholder is its throwaway token: no work.
- `loading`: a KV connector loads the request's KV into its blocks (`WAITING_FOR_REMOTE_KVS`);
  the planner neither schedules nor evicts it until the load ends (vLLM re-reads the status then).
- `running` means resident (holds KV blocks), as in the simulator; `num_kv_blocks` counts the blocks
  of its computed tokens.

Only requests that changed since the last step are re-read and re-keyed (`mark`), so a step costs
in proportion to what changed, not to the number of open sessions. Only the planner needs the
policy's order of all requests; a step that does not consult it (the fast path) re-reads what
changed without moving it in that order, and puts a changed session that is parked (idle, in no
vLLM queue) aside unread until the planner runs or its next chunk comes (`refresh_queued`).
"""

from __future__ import annotations

import itertools

from vllm.v1.request import RequestStatus

from scheduler.policies import Policy
from scheduler.queue import PolicyQueue, queue_key
from scheduler.request import RequestView

PARTIAL_TURN_ARG = "stream2llm_partial"
OPENED_ARG = "stream2llm_opened"  # wall-clock opening of the session a replacement request serves
SUPERSEDES_ARG = "stream2llm_supersedes"  # id of the session's request a replacement supersedes
# Tokens the scheduler had to compute again after evicting or preempting the request, reported on
# its final output (see `engine.vllm_scheduler.PolicySchedulerMixin._free_request`).
RECOMPUTED_KEY = "stream2llm_tokens_recomputed"
# Stop reason of the output that acknowledges a turn appended but not prefilled (`engine.vllm_sessions`).
DEFERRED_TURN = "stream2llm_deferred"
_IDLE = RequestStatus.WAITING_FOR_STREAMING_REQ
_RUNNING = RequestStatus.RUNNING
_LOADING = RequestStatus.WAITING_FOR_REMOTE_KVS  # a KV connector's async load into its blocks in flight


def _client_id(request_id: str) -> str:
    """The id the front end gave a request: vLLM's input processor appends `-` and 8 random
    characters to make the scheduler's id unique (`InputProcessor`, vLLM 0.32; not with
    VLLM_DISABLE_REQUEST_ID_RANDOMIZATION, where the ids are the front end's own)."""
    return request_id.rsplit("-", 1)[0]


def is_partial_params(params) -> bool:
    """True for the sampling parameters of a prefill-only turn of a streamed session."""
    extra = params.extra_args if params is not None else None
    return bool(extra) and bool(extra.get(PARTIAL_TURN_ARG))


def is_partial_turn(request) -> bool:
    """True while the request serves a prefill-only turn of a streamed session."""
    return is_partial_params(request.sampling_params)


def fill_view(view: RequestView, request, block_size: int) -> None:
    """Copy the request's scheduling state into `view` (arrival fields are the book's)."""
    computed = request.num_computed_tokens
    params = request.sampling_params  # `is_partial_turn`, inlined: this runs for every changed request
    extra = params.extra_args if params is not None else None
    partial = bool(extra) and bool(extra.get(PARTIAL_TURN_ARG))
    # The question may wait in the request's streaming queue behind a context turn not yet
    # prefilled: the session is complete then, and must rank as such, or a context turn that only
    # free memory may serve (TailGuard) would hold its own question back forever.
    queued = request.streaming_queue
    view.complete = not partial or bool(queued) and any(
        update is not None and not is_partial_params(update.sampling_params) for update in queued)
    view.num_prompt_tokens = request.num_prompt_tokens
    view.num_computed_tokens = computed
    if partial:  # the turn's sampled token is thrown away: never work
        view.num_output_tokens, view.max_output_tokens = 0, 1
        view.blocked = request.status == _IDLE and computed == 0
    else:  # tokens sampled by steps still in flight (async scheduling) count as output: see module doc
        view.num_output_tokens = request.num_output_tokens + request.num_output_placeholders
        view.max_output_tokens = request.max_tokens
        view.blocked = False
    status = request.status
    view.running = computed > 0 or status == _RUNNING
    view.awaiting_admission = status != _RUNNING
    view.loading = status == _LOADING
    view.num_kv_blocks = -(-computed // block_size)
    view.num_preemptions = request.num_preemptions


class _PerRequest(dict):
    """vLLM `Request` -> a figure of its view as last read (`of_view(view)`), kept until the view
    is read again. Keyed by the request object, hashed by identity: a walk or a sort over vLLM's
    queues, which holds the requests, pays one dict lookup per request (this dict's own
    `__getitem__`, no Python call) and touches neither the request nor its view. The book stores
    the figures when it reads a view; one it lacks is computed here from the view."""

    def __init__(self, views: dict, of_view):
        super().__init__()
        self._views, self._of_view = views, of_view

    def __missing__(self, request):
        value = self[request] = self._of_view(self._views[request.request_id])
        return value


def _work(view: RequestView) -> int:
    return view.num_tokens_to_compute


class ViewBook:
    """The views of all live requests of one scheduler and the policy's order over them."""

    def __init__(self, policy: Policy, block_size: int):
        self.queue = PolicyQueue(policy)
        self.block_size = block_size
        self.views: dict[str, RequestView] = {}
        self._seq = itertools.count()
        self._admissions = itertools.count()
        self._dirty: dict[str, object] = {}
        self._put_aside: dict[str, object] = {}  # changed, not read yet: see `refresh_queued`
        self._unfiled: dict[str, RequestView] = {}  # read, not yet moved in the policy's order
        # KV loads in flight: re-read every step, as vLLM ends a load inside its own `schedule`
        self._loading: dict[str, object] = {}
        self._by_client_id: dict[str, str] = {}  # id the front end gave -> vLLM's internal id
        self.key_of = queue_key(policy)
        # request -> the policy's key of its view: what vLLM's queues are sorted by (`sort_keys`).
        # Computed at the first sort after a read, so a step that does not sort computes none.
        self._keys = _PerRequest(self.views, self.key_of)
        self._unkeyed: dict[object, RequestView] = {}  # request -> view read since its key was computed
        self.work = _PerRequest(self.views, _work)  # request -> its view's `num_tokens_to_compute`
        self._requests: dict[str, object] = {}  # request id -> vLLM's request, to drop its cached key
        # Ids of the requests whose view (as last read) is complete with work: a completed prompt's
        # clock runs. Views change only when read, so with none here no queued view has a running
        # clock, and the early-prefill allowance is the whole budget without a walk of the queues.
        self.clocks: set[str] = set()

    def open(self, request) -> None:
        """A request vLLM has not seen before: its arrival opens the session."""
        arrival = request.arrival_time
        extra = request.sampling_params.extra_args if request.sampling_params is not None else None
        opened = min(arrival, extra.get(OPENED_ARG, arrival)) if extra else arrival
        view = RequestView(request.request_id, next(self._seq), opened, arrival, request.num_prompt_tokens)
        self.views[request.request_id] = view
        self._requests[request.request_id] = request
        self._dirty[request.request_id] = request
        self._by_client_id[_client_id(request.request_id)] = request.request_id
        wanted = extra.get(SUPERSEDES_ARG) if extra else None
        superseded = self.views.get(wanted) or self.views.get(self._by_client_id.get(wanted))
        if superseded is not None:
            superseded.superseded = True
            self.queue.touch(superseded)
            self._forget_key(superseded.request_id)

    def chunk(self, request, arrival: float) -> None:
        """The next turn of a streamed session arrived at `arrival` (vLLM's clock)."""
        view = self.views.get(request.request_id)
        if view is not None and arrival > view.last_chunk_arrival:
            view.record_chunk(arrival)
        self._dirty[request.request_id] = request

    def mark(self, request) -> None:
        """The request's state changed: re-read it before the next plan."""
        if request.request_id in self.views:
            self._dirty[request.request_id] = request

    def admitted(self, request_id: str) -> None:
        view = self.views.get(request_id)
        if view is not None:
            view.admitted_seq = next(self._admissions)

    def close(self, request_id: str) -> None:
        """The request finished: forget it (no entry outlives its request)."""
        view = self.views.pop(request_id, None)
        self._dirty.pop(request_id, None)
        self._put_aside.pop(request_id, None)
        self._unfiled.pop(request_id, None)
        self._loading.pop(request_id, None)
        request = self._requests.pop(request_id, None)
        if request is not None:
            self._keys.pop(request, None)
            self._unkeyed.pop(request, None)
            self.work.pop(request, None)
        self.clocks.discard(request_id)
        if self._by_client_id.get(_client_id(request_id)) == request_id:
            del self._by_client_id[_client_id(request_id)]
        if view is not None:
            self.queue.remove(view)

    def ordered(self) -> list[RequestView]:
        """Re-read the changed requests and return the policy's order of all live ones."""
        self.refresh()
        return self.queue.ordered()

    def refresh(self) -> None:
        """Re-read every changed request and move each to its place in the policy's order (the
        planner's call: it weighs every request, parked ones included)."""
        self._dirty.update(self._put_aside)
        self._put_aside.clear()
        self.refresh_queued(())
        touch = self.queue.touch
        for view in self._unfiled.values():
            touch(view)
        self._unfiled.clear()

    def refresh_queued(self, parked) -> None:
        """The step's fast path, which sorts only vLLM's queues: changed requests in `parked` are put
        aside unread (they are in no queue), the others are read but left where they were in the
        policy's order, `keys` giving their key afresh, until the next `refresh()` files them all."""
        views, block_size, aside, unfiled = self.views, self.block_size, self._put_aside, self._unfiled
        unkeyed, work_of, clocks = self._unkeyed, self.work, self.clocks
        if self._loading:
            self._dirty.update(self._loading)
            self._loading.clear()
        for request_id, request in self._dirty.items():
            if request_id in parked:
                aside[request_id] = request
                continue
            # One read before the planner's `refresh` may leave an entry in `aside`: it only makes
            # that refresh read the request once more (a read is idempotent), and saves a dict
            # operation per read here.
            view = views[request_id]
            fill_view(view, request, block_size)
            unfiled[request_id] = view
            unkeyed[request] = view
            work = work_of[request] = view.num_tokens_to_compute
            if work and view.complete:
                clocks.add(request_id)
            elif clocks:  # most steps have no running clock: no set operation then
                clocks.discard(request_id)
            if view.loading:
                self._loading[request_id] = request
        self._dirty.clear()

    def sort_keys(self):
        """The key function vLLM's queues are sorted by (the key cache's `__getitem__`), once the keys of the
        requests read since the last sort are computed (one pass, no call per request but the
        policy's key)."""
        unkeyed = self._unkeyed
        if unkeyed:
            self._keys.update(zip(unkeyed, map(self.key_of, unkeyed.values())))
            unkeyed.clear()
        return self._keys.__getitem__

    def key(self, request_id: str) -> tuple:
        """The policy's current key of a live request (as of the last `refresh` or `refresh_queued`)."""
        return self.sort_keys()(self._requests[request_id])

    def _forget_key(self, request_id: str) -> None:
        request = self._requests.get(request_id)
        if request is not None:
            self._keys.pop(request, None)

    def __len__(self) -> int:
        return len(self.views)
