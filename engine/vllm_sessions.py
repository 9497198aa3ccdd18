"""Streaming sessions inside the scheduler plug-in: idle sessions parked outside vLLM's queues and
slots, evicted ones trimmed and resumed, and streams degraded to one-shot.

vLLM 0.32 keeps a session that waits for its next chunk (`WAITING_FOR_STREAMING_REQ`) in its
waiting queues and counts it against `max_num_seqs`; enough idle sessions stall all new work. Here
an idle session is parked: out of the queues (the engine core does not spin on it) and out of the
slot count, with its KV kept until the planner evicts it. Its next chunk puts it back in line.

A turn that has not started when the session's next one arrives takes that one in (`_absorb_turn`),
and a turn that starts takes in every turn queued behind it (they came while the previous one ran).
Otherwise vLLM runs queued turns one at a time, each re-admitted behind every running request and
ending in a throwaway sample, so a session whose chunks arrive while the engine is too busy to
prefill them would get its first token later than the same prompt sent whole. Taken in, its waiting
context (and its question, when that is what arrives) is one prompt, prefilled as a one-shot
request's would be; each taken-in turn is acknowledged as not prefilled.

A policy with `degrade_evicted_streams` (TailGuard) stops streaming for a session whose KV was
evicted while it was idle: its later context chunks are appended without being prefilled, and it
runs once, as a one-shot request, when its question arrives. vLLM's front end expects one output
per turn, so each such turn is acknowledged with an output that carries `DEFERRED_TURN` as its
stop reason (the engine's `LiveRequest` counts it as accepted, not prefilled).
"""

from __future__ import annotations

from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason
from vllm.v1.request import RequestStatus, StreamingUpdate

from engine.vllm_views import DEFERRED_TURN, is_partial_params

_IDLE = RequestStatus.WAITING_FOR_STREAMING_REQ
_WAITING = RequestStatus.WAITING


class SessionParkingMixin:
    """Mixed into the plug-in before vLLM's scheduler; uses its `book` and `stream_policy`."""

    def init_sessions(self) -> None:
        self.parked: dict[str, object] = {}  # idle sessions kept outside vLLM's queues and slots
        self._settled: set[str] = set()  # parked sessions whose KV was evicted (throwaway trimmed)
        self._deferred_turns: list = []  # turns of degraded sessions to acknowledge

    def forget_session(self, request_id: str) -> None:
        self.parked.pop(request_id, None)
        self._settled.discard(request_id)

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
        self._settled.add(request.request_id)

    def add_request(self, request) -> None:
        session = self.requests.get(request.request_id)
        # WAITING: in a waiting queue, its turn not started (a started turn is RUNNING or PREEMPTED);
        # nothing queued ahead of the newcomer, so taking it in keeps the turns' order.
        if (session is not None and session.resumable and session.status == _WAITING
                and not session.streaming_queue):
            update = StreamingUpdate.from_request(request)
            if update is not None:
                self._absorb_turn(session, update)
                return
        super().add_request(request)

    def _absorb_turn(self, session, update) -> None:
        """Append the next turn to the session's current one, which has not started (see module doc)."""
        self._append_whole(session, update, session.num_computed_tokens)
        self.book.chunk(session, update.arrival_time)
        self._deferred_turns.append(session)  # the absorbed turn's output: accepted, not prefilled

    def _handle_stopped_request(self, request) -> bool:
        finished = super()._handle_stopped_request(request)
        if not finished:
            if request.status == _IDLE:
                self._park(request)
            self.book.mark(request)
        return finished

    def _park(self, request) -> None:
        """Take an idle session out of vLLM's queues and its running-slot count."""
        queue = self.kv_holding_waiting if self._holds_kv_blocks(request) else self.waiting
        queue.remove_request(request)
        self.deferred_waiting.discard(request)
        self.num_waiting_for_streaming_input -= 1
        # The model runner drops its per-request slot for preempted ids; the session's next turn
        # is sent to it as a new request with all its tokens, as vLLM sends every resumed stream.
        self.reset_preempted_req_ids.add(request.request_id)
        self.parked[request.request_id] = request

    def _update_request_as_session(self, session, update) -> None:
        request_id = session.request_id
        was_parked = self.parked.pop(request_id, None) is not None
        if was_parked:
            self.num_waiting_for_streaming_input += 1  # vLLM's update takes it off again
        settled = request_id in self._settled
        if settled:  # already trimmed; its KV is gone: prefill again (prefix cache permitting)
            self._append_whole(session, update, 0)
        else:
            super()._update_request_as_session(session, update)
        self.book.chunk(session, update.arrival_time)
        if settled and self.stream_policy.degrade_evicted_streams and is_partial_params(update.sampling_params):
            session.status = _IDLE  # degraded: wait for the question, parked (still settled)
            self.parked[request_id] = session
            self._deferred_turns.append(session)
            return
        self._settled.discard(request_id)
        queued = session.streaming_queue
        while queued and queued[0] is not None:  # turns that came while the last one ran
            self._absorb_turn(session, queued.popleft())
        if was_parked:
            self._enqueue_waiting_request(session)

    def _append_whole(self, session, update, computed: int) -> None:
        """vLLM's turn update, keeping every token of the session: it trims at
        `num_computed_tokens`, for a throwaway token this session does not have (already trimmed,
        or its turn has not run); `computed` is the session's computed count afterwards."""
        session.num_computed_tokens = session.num_tokens
        super()._update_request_as_session(session, update)
        session.num_computed_tokens = computed

    def update_from_output(self, scheduler_output, model_runner_output):
        # Acknowledgements go before the step's outputs: a session whose absorbed turn is
        # acknowledged may finish the turn that took it in within this very step.
        acks: dict[int, list] = {}
        for request in self._deferred_turns:
            if request.request_id in self.requests:  # else finished meanwhile
                acks.setdefault(request.client_index, []).append(EngineCoreOutput(
                    request.request_id, [request.all_token_ids[-1]],
                    finish_reason=FinishReason.STOP, stop_reason=DEFERRED_TURN))
        self._deferred_turns.clear()
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        for client_index, ordered_first in acks.items():
            bucket = outputs.get(client_index)
            if bucket is None:
                bucket = outputs[client_index] = EngineCoreOutputs(outputs=[])
            bucket.outputs[:0] = ordered_first
        return outputs

    def has_requests(self) -> bool:
        return super().has_requests() or bool(self._deferred_turns)

    def has_finished_requests(self) -> bool:
        """vLLM's own test, with parked sessions counted as queued: with a KV connector it takes any
        request in none of its queues for one whose connector clean-up is pending, and the engine
        core would then step empty batches for as long as a session is parked."""
        if self.finished_req_ids:
            return True
        if self.connector is None:
            return False
        num_running, num_waiting = self.get_request_counts()
        return len(self.requests) > num_running + num_waiting + len(self.parked)

    def finish_requests(self, request_ids, finished_status):
        ids = (request_ids,) if isinstance(request_ids, str) else request_ids
        for request_id in ids if ids is not None else list(self.parked):
            if request_id in self.parked:
                self.num_waiting_for_streaming_input += 1  # vLLM's finish takes it off again
        return super().finish_requests(request_ids, finished_status)
