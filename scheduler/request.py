"""A plain, engine-agnostic view of one request, as the policies and the planner see it.

The owner (the vLLM adapter in `engine/`, or the simulator) keeps one mutable view per request and
updates it in place; after changing a field a policy's key reads, it calls `PolicyQueue.touch(view)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

NO_ESTIMATE = float("inf")


@dataclass(slots=True, eq=False)
class RequestView:
    request_id: str
    seq: int  # unique, increasing with arrival: the final tie-breaker of every order
    first_chunk_arrival: float
    last_chunk_arrival: float
    num_prompt_tokens: int  # prompt tokens known so far (context chunks + question once complete)
    complete: bool = False  # last chunk (and the question) has arrived
    max_output_tokens: int = 1
    num_output_tokens: int = 0
    num_computed_tokens: int = 0  # tokens with valid KV, on the device or swapped to the host
    num_kv_blocks: int = 0  # device blocks held
    num_swapped_blocks: int = 0  # host blocks held (swap pool)
    running: bool = False  # resident: holds device blocks
    # vLLM only: in a waiting queue, not in its running list (it may hold KV all the same); the
    # planner prices its admission by vLLM's rule (`StepBudget.admit_whole_sequence`).
    awaiting_admission: bool = False
    admitted_seq: int = -1  # order of the latest admission to the running set
    admitted_at: float = -1.0
    num_preemptions: int = 0
    # A partial stream that cannot run: evicted while idle, it waits for its next chunk (vLLM keeps
    # such a session out of its queues; recomputing it early would sample a token nobody asked for);
    # under a policy that degrades evicted streams, it waits for its question (`unblock`).
    blocked: bool = False
    # Its KV is being loaded into its blocks (vLLM: an async KV-connector load in flight): it cannot
    # run, and its blocks cannot be freed, until the load ends; the planner never evicts it.
    loading: bool = False
    superseded: bool = False  # replaced by a newer request of its session (engine: after a `replace`)
    chunk_gaps: list[float] = field(default_factory=list)  # recent inter-chunk gaps, oldest first

    @property
    def num_known_tokens(self) -> int:
        """Prompt plus sampled tokens: what a recompute would have to prefill."""
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def num_tokens_to_compute(self) -> int:
        # `finished` and `num_known_tokens` inlined: every policy key reads this on every touch.
        if self.blocked or (self.complete and self.num_output_tokens >= self.max_output_tokens):
            return 0
        return self.num_prompt_tokens + self.num_output_tokens - self.num_computed_tokens

    @property
    def finished(self) -> bool:
        return self.complete and self.num_output_tokens >= self.max_output_tokens

    @property
    def idle(self) -> bool:
        """A partial stream with nothing to compute until its next chunk arrives."""
        return not self.complete and self.num_tokens_to_compute == 0

    @property
    def swapped(self) -> bool:
        return self.num_swapped_blocks > 0

    def unblock(self, degrade_evicted: bool) -> None:
        """After a chunk arrived (and `complete` was updated): may the stream run again? A stream
        degraded to one-shot (`Policy.degrade_evicted_streams`) waits for its question."""
        if self.blocked and (self.complete or not degrade_evicted):
            self.blocked = False

    def record_chunk(self, now: float, keep_gaps: int = 4) -> None:
        """Note a later chunk's arrival at `now` (the view is created at the first one)."""
        gap = now - self.last_chunk_arrival
        if gap > 0:
            self.chunk_gaps.append(gap)
            del self.chunk_gaps[:-keep_gaps]
        self.last_chunk_arrival = now
