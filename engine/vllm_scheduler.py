"""vLLM scheduler plug-in (`scheduler_cls`): idle streaming sessions can be preempted.

Stock vLLM 0.32 never preempts a streaming session that waits for its next chunk: it keeps its KV
blocks, so enough idle sessions starve everyone else and concurrent sessions deadlock. Before each
step this scheduler compares the KV demand of the requests that can run now with the free blocks
and, while demand exceeds supply, evicts idle sessions (recompute: their blocks go back to the
pool, still hashed in the prefix cache). Victims come from the tail of the configured policy's
order (`scheduler.policies`), so the policy decides who keeps memory. An evicted session resumes
transparently when its next chunk arrives: vLLM schedules it as a new prefill and the prefix cache
returns whatever blocks survived. The policy name comes from `additional_config["stream2llm_policy"]`.
"""

from __future__ import annotations

import itertools

import time

from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreEventType
from vllm.v1.request import RequestStatus

from scheduler.policies import make_policy
from scheduler.request import RequestView

POLICY_KEY = "stream2llm_policy"
_SCHEDULABLE = (RequestStatus.WAITING, RequestStatus.PREEMPTED)
_EVICTABLE = (*_SCHEDULABLE, RequestStatus.WAITING_FOR_STREAMING_REQ)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class StreamingScheduler(Scheduler):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        extra = self.vllm_config.additional_config
        name = extra.get(POLICY_KEY, "default_vllm") if isinstance(extra, dict) else "default_vllm"
        self.stream_policy = make_policy(name)
        self._seq = itertools.count()
        self._views: dict[str, RequestView] = {}
        self._evicted_idle: set[str] = set()

    def schedule(self, *args, **kwargs):
        self._make_room_for_next_request()
        return super().schedule(*args, **kwargs)

    # ---- eviction ----------------------------------------------------------------------
    def _next_candidate(self):
        """The request vLLM's waiting pass will try first: KV holders drain before new ones."""
        for queue in (self.kv_holding_waiting, self.waiting):
            for request in queue:
                if request.status in _SCHEDULABLE:
                    return request
        return None

    def _make_room_for_next_request(self) -> None:
        """Free enough blocks for the next waiting request by evicting other KV holders.

        Without this, waiting requests that hold KV (idle streams, and streams whose next chunk
        cannot get blocks) starve each other forever. The candidate itself is never evicted, so
        every step can make progress as long as one request fits in the cache.
        """
        head = self._next_candidate()
        if head is None:
            return
        remaining = min(head.num_tokens - head.num_computed_tokens, self.max_num_scheduled_tokens)
        wanted = _cdiv(remaining, self.block_size) + len(self.running) + 1
        shortfall = wanted - self.kv_cache_manager.block_pool.get_num_free_blocks()
        if shortfall <= 0:
            return
        holders = [r for r in self.kv_holding_waiting if r is not head and r.num_computed_tokens > 0
                   and r.status in _EVICTABLE]
        for view in reversed(self.stream_policy.order(self._view(r) for r in holders)):
            if shortfall <= 0:
                break
            victim = self.requests[view.request_id]
            shortfall -= _cdiv(victim.num_computed_tokens, self.block_size)
            self._evict(victim)

    def _evict(self, request) -> None:
        if request.status == RequestStatus.WAITING_FOR_STREAMING_REQ:
            self._settle_idle_session(request)
        self.kv_holding_waiting.remove_request(request)
        self._free_request_blocks(request)
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        # Status stays as it is: a WAITING stream is then sent to the worker as a new request with
        # all its tokens (how vLLM resumes streams); an idle one stays blocked until its next chunk.
        self.waiting.add_request(request)
        self.reset_preempted_req_ids.add(request.request_id)
        if self.log_stats:  # reported like vLLM's own preemptions (kind: recompute)
            request.record_event(EngineCoreEventType.PREEMPTED, time.monotonic())

    def _settle_idle_session(self, request) -> None:
        """Drop the turn's throwaway sampled token now, as vLLM does when the next chunk comes.

        vLLM uses `num_computed_tokens` as the frontier of what to keep when the next chunk
        arrives; eviction resets it to 0, so the trim is done here and skipped later.
        """
        frontier = request.num_computed_tokens
        kept = request._all_token_ids[request.num_prompt_tokens:frontier]
        del request._all_token_ids[frontier:]
        del request.block_hashes[frontier // self.hash_block_size:]
        request._output_token_ids.clear()
        request.prompt_token_ids.extend(kept)
        request.num_prompt_tokens = len(request.prompt_token_ids)
        self._evicted_idle.add(request.request_id)

    def _update_request_as_session(self, session, update) -> None:
        if session.request_id not in self._evicted_idle:
            return super()._update_request_as_session(session, update)
        self._evicted_idle.discard(session.request_id)
        session.num_computed_tokens = session.num_tokens  # already trimmed: keep every token
        super()._update_request_as_session(session, update)
        session.num_computed_tokens = 0  # its KV is gone: prefill again (prefix cache permitting)

    def _view(self, request) -> RequestView:
        view = self._views.get(request.request_id)
        if view is None:
            view = RequestView(request.request_id, next(self._seq), request.arrival_time,
                               request.arrival_time, request.num_tokens)
            self._views[request.request_id] = view
        elif request.arrival_time > view.last_chunk_arrival:
            view.record_chunk(request.arrival_time)
        view.num_prompt_tokens = request.num_tokens
        view.num_computed_tokens = request.num_computed_tokens
        view.num_kv_blocks = _cdiv(request.num_computed_tokens, self.block_size)
        view.running = True  # resident: it holds device blocks
        return view

    def finish_requests(self, request_ids, finished_status):
        finished = super().finish_requests(request_ids, finished_status)
        for request in finished:
            self._views.pop(request.request_id, None)
            self._evicted_idle.discard(request.request_id)
        return finished
