"""TailGuard: our policy for P99 TTFT under KV-memory pressure.

Why the paper's policies blow up or thrash: a stream that was evicted while partial is re-admitted
as soon as its next chunk arrives, evicting another idle stream, which in turn comes back at its
next chunk: memory changes hands at the price of a full recompute each time, and that recompute
competes with the requests whose TTFT clock is running.

The order, in bands (ascending = higher priority; the planner evicts from the tail):

0. Complete requests whose KV is resident, oldest last chunk first: their TTFT clock runs and
   what is left is cheap (the question, or the last chunk), and finishing them frees their memory
   soonest; first come first served on that clock bounds the wait of every one of them.
1. Complete requests that were evicted, oldest last chunk first: each needs a full recompute, so
   they queue behind the cheap ones instead of delaying a whole batch of them.
2. Resident partial streams with a new chunk: cheap incremental prefill on KV already held.
3. Resident idle partial streams, by the expected arrival of their next chunk: last chunk time
   plus the mean of their own recent inter-chunk gaps. The tail (first victims) is the stream whose
   KV will sit unused the longest; a stream with no gap history yet (one chunk, little invested) is
   assumed far away. Recompute cost and memory freed are both proportional to the victim's tokens,
   so memory per unit of recompute is flat and the time-until-needed alone decides.
4. Non-resident partial streams with work (new, or evicted earlier), most stale last chunk first:
   they take only free memory, never an idle resident stream's: no ping-pong. An evicted stream
   that gets no memory back simply completes as a non-streaming request would (band 1), which
   bounds its TTFT by the non-streaming one instead of by the thrash.
5. Non-resident with nothing to compute (swapped-out idle streams): nothing to schedule.

Adaptive streaming (beyond the paper): a stream evicted while idle stops streaming
(`degrade_evicted_streams`). Under memory shortage its early prefill has already been lost once;
prefilling its later chunks again would buy memory it is likely to lose again, paid with recompute
that delays everyone whose TTFT clock runs (the thrash). So its later chunks are only appended,
and it runs once, as a one-shot request, when its question arrives (band 1): its TTFT is bounded
by the non-streaming one, streams that kept their memory keep streaming, and with no shortage
nothing is evicted and nothing degrades. Streaming thus degrades gracefully toward one-shot, stream
by stream, as pressure grows.

Early prefill yields to running clocks (beyond the paper): while a completed prompt has work in
the step (a prefill whose TTFT clock runs, or a decode), partial streams may prefill at most 1/32
of the step's token budget (`early_prefill_share`; 256 of 8,192 tokens). A step's duration grows
with its tokens once compute outweighs the weight reads of a decode step (a few hundred tokens for
an 8B model on an H200), so a step filled with early prefill delays every first token and every
decode in it: when the engine is busy, early prefill buys nothing a one-shot request would not get
later and costs the requests whose clocks run now. When nothing else has work, streams get the
whole budget. Under the vLLM plug-in a chunk bigger than what is left of the allowance waits whole
(vLLM cannot cut it); the simulator cuts it. And while the completed prompts with work need more
KV blocks than are free, partial streams prefill nothing (`StepBudget.early_allowance`): a block a
stream takes then is one a question needs next, so it would be evicted, and its prefill recomputed,
before it paid.

Measured in the simulator at paper scale (`python -m bench.policies`, bench/results/policies.json,
rendered in docs/BENCHMARKS.md; six scenarios, trace seeds 0-2): TailGuard has the lowest streamed
P99 TTFT of the five policies in all 18 runs, and at most the one-shot P99 in all 18, at parity
(0.994x) on the heavy-tailed crawler workload's seed 1. The analysis of that workload led to the
memory gate above and to the planner's rule that a completed prompt's KV may displace blocked
streams' swapped KV from a full host pool (`planner._make_swap_room`, for every policy);
`early_prefill_share` was chosen on seed 0 of the other workloads.
"""

from scheduler.policies.base import Policy
from scheduler.request import NO_ESTIMATE, RequestView


class TailGuardPolicy(Policy):
    name = "tailguard"
    degrade_evicted_streams = True
    early_prefill_share = 1 / 32

    def sort_key(self, view: RequestView) -> tuple:
        if view.complete:
            return (0 if view.running else 1, view.last_chunk_arrival, view.seq)
        # A partial request is never finished, so its work is simply known minus computed tokens
        # (inlined: this key is computed for every touched request on every step).
        has_work = (not view.blocked
                    and view.num_prompt_tokens + view.num_output_tokens > view.num_computed_tokens)
        if view.running:
            if has_work:
                return (2, view.last_chunk_arrival, view.seq)
            return (3, expected_next_chunk(view), view.seq)
        return (4 if has_work else 5, view.last_chunk_arrival, view.seq)


def expected_next_chunk(view: RequestView) -> float:
    gaps = view.chunk_gaps
    if not gaps:
        return NO_ESTIMATE
    return view.last_chunk_arrival + sum(gaps) / len(gaps)
