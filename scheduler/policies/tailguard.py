"""TailGuard: our policy for P99 TTFT under KV-memory pressure.

Why the paper's policies blow up or thrash: a stream that was evicted while partial is re-admitted
as soon as its next chunk arrives, evicting another idle stream, which in turn comes back at its
next chunk: memory changes hands at the price of a full recompute each time, and that recompute
competes with the requests whose TTFT clock is running.

The order, in five bands (ascending = higher priority; the planner evicts from the tail):

0. Complete requests (prefill left or decoding), oldest last chunk first: their TTFT clock runs,
   so first come first served on that clock bounds the wait of every one of them.
1. Resident partial streams with a new chunk: cheap incremental prefill on KV already held.
2. Resident idle partial streams, by the expected arrival of their next chunk: last chunk time
   plus the mean of their own recent inter-chunk gaps. The tail (first victims) is the stream whose
   KV will sit unused the longest; a stream with no gap history yet (one chunk, little invested) is
   assumed far away. Recompute cost and memory freed are both proportional to the victim's tokens,
   so memory per unit of recompute is flat and the time-until-needed alone decides.
3. Non-resident partial streams with work (new, or evicted earlier), by first arrival: they take
   only free memory, never an idle resident stream's: no ping-pong. An evicted stream that gets no
   memory back simply completes as a non-streaming request would (full prefill in band 0), which
   bounds its TTFT by the non-streaming one instead of by the thrash.
4. Non-resident with nothing to compute (swapped-out idle streams): nothing to schedule.
"""

from scheduler.policies.base import Policy
from scheduler.request import NO_ESTIMATE, RequestView


class TailGuardPolicy(Policy):
    name = "tailguard"

    def sort_key(self, view: RequestView) -> tuple:
        if view.complete:
            return (0, view.last_chunk_arrival, view.seq)
        # A partial request is never finished, so its work is simply known minus computed tokens
        # (inlined: this key is computed for every touched request on every step).
        has_work = view.num_prompt_tokens + view.num_output_tokens > view.num_computed_tokens
        if view.running:
            if has_work:
                return (1, view.last_chunk_arrival, view.seq)
            return (2, expected_next_chunk(view), view.seq)
        return (3 if has_work else 4, view.first_chunk_arrival, view.seq)


def expected_next_chunk(view: RequestView) -> float:
    gaps = view.chunk_gaps
    if not gaps:
        return NO_ESTIMATE
    return view.last_chunk_arrival + sum(gaps) / len(gaps)
