"""vLLM scheduler plug-in (`scheduler_cls`): the project's policies schedule the real engine.

Before each vLLM step the plug-in builds the policy's order of every live request from vLLM's own
request state (`engine.vllm_views`), calls the same `scheduler.planner.plan_step` the simulator
calls, and applies its decision to vLLM:

- the planner's eviction victims are preempted (recompute: their blocks go back to the pool, still
  hashed in the prefix cache). Running victims go through vLLM's own `_preempt_request`; waiting KV
  holders (idle streams, streams whose next chunk waits for blocks) are freed here. The planner only
  evicts requests ranked below the one it makes room for, so there is no priority inversion and
  no ping-pong between two streams.
- vLLM's running list and both waiting queues are put in the policy's order: who gets the step's
  token budget first, who is admitted first, and whom vLLM itself preempts when a running request
  cannot grow (it takes `running[-1]`, now the lowest-ranked running request). In a step where
  vLLM schedules every queued request whole in any order (their work fits the token budget and
  the slots, the blocks are free, no early-prefill limit applies), the order decides nothing and
  the sort is skipped.
- under a policy that limits early prefill (`StepBudget.early_prefill_tokens`), partial streams
  beyond the step's allowance, running or waiting, sit out the step while a completed prompt has
  work (off vLLM's lists during `schedule` only; vLLM makes its step stats later, in
  `update_from_output`, so they count there where they were).
- idle streaming sessions (waiting for their next chunk) are parked outside vLLM's queues and its
  `max_num_seqs` count, so open sessions never block admission of new work; a parked session keeps
  its KV until the planner evicts it and rejoins the queues when its next chunk arrives.

vLLM's block rules are the planner's in the plug-in (`StepBudget.whole_chunks`,
`admit_whole_sequence`): a chunk is cut to the token budget, never to free memory, a waiting request
is admitted only when its whole sequence fits, and admission stops at the first that does not, so
the planner makes room for what vLLM will schedule; while anything runs, vLLM's admission watermark
(`watermark`, 0 by default) is taken off the free blocks the planner sees, as vLLM keeps it free of
admissions then. Where vLLM's structure still differs from the simulator, which applies the decision
as is: vLLM schedules its running list before any waiting request (a waiting request ranked above a
running one gets budget after it), drains waiting requests that hold KV before those that do not,
admits no waiting request in a step where it preempted, cannot cut a chunk to the early-prefill
allowance (it waits whole), and counts blocks itself (prefix-cache hits can make a request need
fewer blocks than the planner priced), and runs a session's turns one at a time (a chunk that
arrives while the session's turn runs waits for that turn's end, where the simulator appends every
chunk on arrival; a turn not started yet takes later ones in, and the next turn takes in all that
waited: `engine.vllm_sessions`). An idle stream whose KV was evicted stays blocked until its next
chunk in both (the simulator models this too). The plug-in preempts by recompute and passes the
planner no swap pool; on a GPU with `kv_offload_gib`, vLLM's offloading connector
(`engine/kv_offload.py`) may load a victim's KV back instead, and which KV its host pool keeps is
its own LRU order, not the simulator's rule that a completed prompt's KV displaces a blocked
stream's (`planner._make_swap_room`).

The policy name comes from `additional_config[POLICY_KEY]` (`scheduler_additional_config`).
"""

from __future__ import annotations

import time
from collections import deque
from itertools import accumulate, chain

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import FCFSRequestQueue
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreEventType
from vllm.v1.request import RequestStatus

from engine.vllm_seams import check_scheduler, check_vllm
from engine.vllm_sessions import SessionParkingMixin
from engine.vllm_step_blocks import StepBlocks, blocks_of, free_for_planner, may_want_more_than, num_held
from engine.vllm_views import RECOMPUTED_KEY, ViewBook
from scheduler.planner import StepBudget, plan_step
from scheduler.policies import make_policy

POLICY_KEY = "stream2llm_policy"
_IDLE = RequestStatus.WAITING_FOR_STREAMING_REQ
_RUNNING = RequestStatus.RUNNING
# vLLM's FCFS queue is a deque whose `__len__` and `__iter__` are Python wrappers of deque's own
# (`FCFSRequestQueue`, checked in `__init__`): the step's hot path calls deque's directly.
_len = deque.__len__


def scheduler_additional_config(config) -> dict:
    """The `additional_config` entries the plug-in reads, for an `engine.config.EngineConfig`."""
    return {POLICY_KEY: config.policy}


class PolicySchedulerMixin:
    """The plug-in's behaviour, over vLLM's `Scheduler` or its `AsyncScheduler`."""

    def __init__(self, *args, **kwargs):
        check_vllm()  # inside the engine core too: an engine built without `build_vllm_config`
        super().__init__(*args, **kwargs)
        check_scheduler(self)
        extra = self.vllm_config.additional_config
        name = extra.get(POLICY_KEY, "default_vllm") if isinstance(extra, dict) else "default_vllm"
        self.stream_policy = make_policy(name)
        if not isinstance(self.waiting, FCFSRequestQueue):
            raise ValueError("the stream2llm scheduler orders vLLM's queues itself: keep vLLM's "
                             "scheduling policy 'fcfs' (its 'priority' queue cannot be reordered)")
        self.book = ViewBook(self.stream_policy, self.block_size)
        budget = self.max_num_scheduled_tokens
        self.step_budget = StepBudget(budget, self.block_size, whole_chunks=True,
                                      admit_whole_sequence=self.scheduler_config.scheduler_reserve_full_isl,
                                      early_prefill_tokens=self.stream_policy.early_prefill_tokens(budget))
        self._held_back: list[tuple] = []  # (queue, requests) out of vLLM's queues for one step
        self.init_sessions()
        self._debt: dict[str, int] = {}  # tokens computed when last evicted/preempted, not yet back
        self._recomputed: dict[str, int] = {}  # per request: tokens computed again after that

    # ---- the step ----------------------------------------------------------------------
    def schedule(self, *args, **kwargs):
        self.plan_and_apply()
        try:
            return super().schedule(*args, **kwargs)
        finally:
            for queue, requests in self._held_back:
                queue.extend(requests)
                if queue is self.running:
                    self.num_waiting_for_streaming_input -= len(requests)
            self._held_back.clear()

    def plan_and_apply(self) -> None:
        """Order vLLM's queues by the policy and evict what the planner chose (see module doc).

        The planner is consulted only when this step could need an eviction: vLLM's queues hold
        every request with work (idle sessions are parked), and a step allocates at most one block
        per `block_size` tokens of its budget plus one partial block per request it schedules, and
        admits a waiting request only when the blocks of its whole sequence are free
        (`engine.vllm_step_blocks`), so when that many blocks are free the planner would evict
        nothing. The fast path costs in proportion to the requests with work and those that
        changed, not to the open sessions.
        """
        book = self.book
        # The fast path sorts only vLLM's queues: parked (idle) sessions are in none, and the
        # policy's order of all requests is the planner's, whose `book.ordered()` re-reads and
        # files everything first.
        book.refresh_queued(self.parked)
        with_work = len(self.running) + _len(self.waiting) + _len(self.kv_holding_waiting)
        if not with_work:
            return
        free = free_for_planner(self)
        blocks_short = may_want_more_than(self, free, with_work)
        if blocks_short:
            decision = plan_step(book.ordered(), StepBlocks(free, book.views, blocks_of(self)),
                                 self.step_budget, num_held=num_held(self))
            now = time.monotonic()
            for preemption in decision.preempted:
                self._evict(self.requests[preemption.request_id], now)
        if blocks_short or self._order_decides(with_work, free):
            self._order_queues()
            if self.step_budget.early_prefill_tokens is not None:
                self._hold_back_early_prefill(free)

    def _order_decides(self, with_work: int, free: int) -> bool:
        """False when vLLM schedules every queued request whole this step in any order: their
        work fits the token budget, they fit the slots, no early-prefill limit applies, and the
        blocks are there (the caller's fast-path test). Sorting is then skipped: under light load,
        the common case on a GPU, the step costs the re-read of the changed requests only."""
        if with_work > min(self.max_num_running_reqs, self.max_num_active_reqs) or self.lora_config:
            return True  # LoRA: vLLM's max_loras may turn a request away, and order decides which
        # Under contention the walk ends after the budget's worth of requests (`any` stops there);
        # each request's work as last read is one dict lookup by the request object (`ViewBook.work`).
        limit = self.step_budget.max_num_tokens
        queued = chain(self.running, deque.__iter__(self.kv_holding_waiting), deque.__iter__(self.waiting))
        if any(map(limit.__lt__, accumulate(map(self.book.work.__getitem__, queued)))):
            return True
        return self._early_allowance(free) < limit

    def _early_allowance(self, free: int) -> int:
        """`StepBudget.early_allowance` over vLLM's queues; without a completed prompt's view with
        work (`ViewBook.clocks`) it is the whole budget, known without a walk of the queues."""
        budget = self.step_budget
        if budget.early_prefill_tokens is None or not self.book.clocks:
            return budget.max_num_tokens
        return budget.early_allowance(self._queued_views(), free)

    def _queued_views(self):
        """The views of vLLM's queued requests, running first."""
        views = self.book.views
        return (views[r.request_id] for queue in (self.running, self.kv_holding_waiting, self.waiting)
                for r in queue)

    def _order_queues(self) -> None:
        # The key of each request is cached until it changes (`ViewBook.sort_keys`, keyed by the
        # request object), so a sort costs a C-level dict lookup per request and the comparisons,
        # no key computation and no Python call for a request that did not change.
        key = self.book.sort_keys()
        if len(self.running) > 1:
            self.running.sort(key=key)
        for queue in (self.kv_holding_waiting, self.waiting):
            if _len(queue) > 1:
                ranked = sorted(deque.__iter__(queue), key=key)
                queue.clear()
                queue.extend(ranked)

    def _hold_back_early_prefill(self, free: int) -> None:
        """The planner's early-prefill limit (`StepBudget.early_allowance`, `early_limit`) on vLLM's queues.

        While a completed prompt has work, partial streams get the allowance in policy order,
        running ones first (vLLM schedules those first); the rest sit out this step, off the
        running list or the waiting queues until `schedule` returns. vLLM cannot cut one
        request's chunk to what is left of the allowance, so such a chunk waits whole (the
        simulator cuts it). A running stream held back keeps its KV and its slot: vLLM's admission
        counts slots as `len(running)` plus the sessions waiting for input, so those held out of
        `running` are added to the latter for the step. Under async scheduling a request whose
        output of the previous step is still in flight (output placeholders) is never held, nor
        one whose KV a connector is loading: vLLM notices the end of the load only in its queue."""
        budget, views = self.step_budget, self.book.views
        queues = (self.running, self.kv_holding_waiting, self.waiting)
        left = self._early_allowance(free)
        if left >= budget.max_num_tokens:
            return
        for queue in queues:
            kept, held = [], []
            for request in queue:
                view = views[request.request_id]
                work = view.num_tokens_to_compute
                if view.loading:
                    kept.append(request)
                elif request.num_output_placeholders or budget.early_limit(view, work, budget.max_num_tokens, left):
                    left -= 0 if view.complete else work
                    kept.append(request)
                else:
                    held.append(request)
            if held:
                queue.clear()
                queue.extend(kept)
                self._held_back.append((queue, held))
                if queue is self.running:
                    self.num_waiting_for_streaming_input += len(held)

    # ---- eviction ----------------------------------------------------------------------
    def _evict(self, request, now: float) -> None:
        """Free the request's KV; it recomputes (prefix cache permitting) when it runs again."""
        self._owe(request)
        if request.status == _RUNNING:
            self.running.remove(request)
            self._preempt_request(request, now)  # vLLM's own: back to the front of `waiting`
            return
        if request.request_id in self.parked:
            self._settle_idle_session(request)
        else:  # a waiting stream whose new chunk has not been admitted yet
            self.kv_holding_waiting.remove_request(request)
            self.waiting.add_request(request)
            self.reset_preempted_req_ids.add(request.request_id)
        self._free_request_blocks(request)
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.book.mark(request)
        if self.log_stats:  # reported like vLLM's own preemptions (kind: recompute)
            request.record_event(EngineCoreEventType.PREEMPTED, now)

    def _preempt_request(self, request, timestamp: float, drop_stale_output: bool = False) -> None:
        self._owe(request)
        super()._preempt_request(request, timestamp, drop_stale_output)
        self.book.mark(request)

    def _owe(self, request) -> None:
        """Remember what an eviction throws away; `_update_after_schedule` settles it."""
        if request.num_computed_tokens:
            rid = request.request_id
            self._debt[rid] = max(self._debt.get(rid, 0), request.num_computed_tokens)

    def _settle_debt(self, request_id: str) -> None:
        """At re-admission: tokens thrown away minus what the prefix cache gave back."""
        debt = self._debt.pop(request_id, 0)
        if debt:
            hits = self.requests[request_id].num_computed_tokens
            self._recomputed[request_id] = self._recomputed.get(request_id, 0) + max(0, debt - hits)

    # ---- bookkeeping -----------------------------------------------------------------------
    def add_request(self, request) -> None:
        is_new = request.request_id not in self.requests
        super().add_request(request)
        if is_new:
            self.book.open(request)
        else:  # a later turn: applied now (`_update_request_as_session`) or queued behind the current one
            session = self.requests.get(request.request_id)
            if session is not None:  # the end of its input can finish an idle session right here
                self.book.mark(session)

    def _free_request(self, request, *args, **kwargs):
        """Every finished request passes here: no per-request entry outlives it.

        The tokens recomputed after evictions ride on the final output's `kv_transfer_params`
        (under `RECOMPUTED_KEY`), vLLM's only per-request field from the scheduler to
        `RequestOutput`; it is used only when no KV connector owns that field."""
        request_id = request.request_id
        self.forget_session(request_id)
        self._debt.pop(request_id, None)
        recomputed = self._recomputed.pop(request_id, 0)
        self.book.close(request_id)
        kv_params, ec_params = super()._free_request(request, *args, **kwargs)
        if recomputed and kv_params is None and self.connector is None:
            kv_params = {RECOMPUTED_KEY: recomputed}
        return kv_params, ec_params

    def _set_kv_fetch_stage(self, request, stage) -> None:
        """Each stage of a connector's KV load (started, done, admitted) re-reads the view."""
        super()._set_kv_fetch_stage(request, stage)
        self.book.mark(request)

    def _update_after_schedule(self, scheduler_output) -> None:
        admitted = [new.req_id for new in scheduler_output.scheduled_new_reqs]
        admitted.extend(scheduler_output.scheduled_cached_reqs.resumed_req_ids)
        for request_id in admitted:
            self.book.admitted(request_id)
            if request_id in self._debt:
                self._settle_debt(request_id)
        super()._update_after_schedule(scheduler_output)
        requests, mark = self.requests, self.book.mark
        for request_id in scheduler_output.num_scheduled_tokens:
            mark(requests[request_id])


class StreamingScheduler(PolicySchedulerMixin, SessionParkingMixin, Scheduler):
    """The plug-in over vLLM's synchronous scheduler (the CPU engine's mode)."""


class AsyncStreamingScheduler(PolicySchedulerMixin, SessionParkingMixin, AsyncScheduler):
    """The same plug-in over vLLM's `AsyncScheduler`, for engines that run async scheduling (the
    GPU default): scheduling of step N+1 overlaps the forward pass of step N."""


def scheduler_class(async_scheduling: bool) -> type[Scheduler]:
    """The plug-in class matching the engine core's scheduling mode (vLLM resolves it per platform)."""
    return AsyncStreamingScheduler if async_scheduling else StreamingScheduler
