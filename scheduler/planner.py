"""The two-phase scheduling step, as a pure planner (no I/O, in the spirit of vLLM v1's
SchedulerInterface). The simulator and the vLLM plug-in (`engine.vllm_scheduler`) both call
`plan_step` on the policy's order of the same kind of views.

Phase 1 walks the policy's order and picks the set that fits the token budget and the KV-block
budget (capacity = free blocks + blocks held by the listed requests): requests with work get tokens
(chunked when the budget is short), resident requests that fit keep their blocks. Phase 2 acquires
the blocks of that set through the block manager, evicting from the tail of the order among
requests not chosen, until the allocation fits.

Eviction never inverts priority: a request only ever takes memory from requests ranked below it
(so two requests cannot evict each other back and forth). A chosen request that could fit only by
evicting a higher-ranked one is not scheduled this step. One exception keeps the engine live: when
nothing in the policy's order can compute (idle holders ranked ahead of all work, as in
default_vllm's order), the first request with work that fits on its own is moved to the front and
may take memory from requests with nothing to compute, and only from those.
A policy may limit early prefill (`StepBudget.early_prefill_tokens`): while a completed prompt has
work, partial streams share that many tokens of the step, and phase 1 gives them no more; while
the completed prompts need more blocks than are free, they get none (`StepBudget.early_allowance`).
The swap pool follows the clocks too: a completed prompt evicted while the pool is full may take
the host memory of blocked partial streams' swapped KV (`_make_swap_room`), never the reverse.
The planner never touches the views: the owner applies the returned decision.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from scheduler.blocks import BlockManager, SwapPool
from scheduler.cost_model import CostModel
from scheduler.preemption import SWAP, choose_preemption_kind, swap_pays
from scheduler.request import RequestView


class PlannerError(RuntimeError):
    """The inputs break the planner's accounting (a bug in the owner, not a capacity problem)."""


@dataclass(frozen=True)
class StepBudget:
    """One step's token budget and the engine's block rules.

    The simulator cuts a prefill to the blocks it can get. vLLM does not: a chunk (cut to the token
    budget only) gets all its blocks or is not scheduled, and a request not yet in its running list
    is admitted only when its whole known sequence fits (`scheduler_reserve_full_isl`), the first
    such request that does not fit ending admission for the step. The plug-in sets both flags, so
    that what the planner makes room for is what vLLM then schedules.
    """

    max_num_tokens: int
    block_size: int
    whole_chunks: bool = False
    admit_whole_sequence: bool = False
    # Tokens of early prefill (partial streams) a step may carry while a completed prompt has work
    # in it; None: no limit. From the policy (`Policy.early_prefill_tokens`).
    early_prefill_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.max_num_tokens <= 0 or self.block_size <= 0:
            raise PlannerError(f"budget must be positive: {self}")
        if self.early_prefill_tokens is not None and self.early_prefill_tokens < 0:
            raise PlannerError(f"early_prefill_tokens must be >= 0: {self}")

    def early_allowance(self, views: Iterable[RequestView], free_blocks: int) -> int:
        """Tokens partial streams may prefill this step: the whole budget, unless the policy limits
        early prefill and some completed prompt (a prefill whose TTFT clock runs, or a decode) has
        work, which every extra token of the step would delay; and none while the completed prompts
        with work need more blocks than are free: what a stream prefills then takes memory a
        question needs next, and is evicted (recomputed) before it pays."""
        if self.early_prefill_tokens is None:
            return self.max_num_tokens
        clocks_run, blocks_needed = False, 0
        for view in views:
            if view.complete and (work := view.num_tokens_to_compute):
                clocks_run = True
                blocks_needed += blocks_after(view, work, self) - view.num_kv_blocks
                if blocks_needed > free_blocks:
                    return 0
        return self.early_prefill_tokens if clocks_run else self.max_num_tokens

    def early_limit(self, view: RequestView, work: int, token_left: int, early_left: int) -> int:
        """The tokens `view` may be given (before memory) with `early_left` of the allowance left;
        under `whole_chunks` a partial stream's chunk is not cut to the allowance: it waits."""
        if view.complete:
            return token_left
        if self.whole_chunks and min(work, token_left) > early_left:
            return 0
        return min(token_left, early_left)


@dataclass(frozen=True)
class Preemption:
    request_id: str
    kind: str  # "recompute" | "swap"
    num_blocks: int
    num_tokens: int


@dataclass
class StepDecision:
    scheduled: list[tuple[str, int]] = field(default_factory=list)  # (id, tokens), by priority
    swapped_in: list[tuple[str, int]] = field(default_factory=list)  # (id, blocks)
    preempted: list[Preemption] = field(default_factory=list)
    # (id, blocks) of swapped-out KV discarded from the swap pool (`_make_swap_room`): the owner
    # marks it not computed, so the request recomputes it when it runs again
    dropped: list[tuple[str, int]] = field(default_factory=list)
    num_kept: int = 0  # resident requests that keep their blocks without computing

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(tokens for _, tokens in self.scheduled)


def _blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


def blocks_after(view: RequestView, tokens: int, budget: StepBudget) -> int:
    """Blocks `view` holds once `tokens` more are computed, as the engine allocates them."""
    if budget.admit_whole_sequence and view.awaiting_admission:
        needed = max(view.num_known_tokens, view.num_computed_tokens + tokens)
    else:
        needed = view.num_computed_tokens + tokens
    return max(view.num_kv_blocks, _blocks_for(needed, budget.block_size))


def _tokens_that_fit(view: RequestView, work: int, token_left: int, block_left: int,
                     budget: StepBudget) -> int:
    if not budget.whole_chunks:
        return min(work, token_left, block_left * budget.block_size - view.num_computed_tokens)
    tokens = min(work, token_left)
    return tokens if blocks_after(view, tokens, budget) <= block_left else 0


def choose(ordered: Sequence[RequestView], budget: StepBudget, capacity: int, free: int) -> list[tuple]:
    """Phase 1: (rank, view, tokens, blocks held after the step) for every request that keeps memory."""
    chosen = []
    token_left, block_left = budget.max_num_tokens, capacity
    early_left = budget.early_allowance(ordered, free)
    admitting = True  # vLLM stops admitting at the first waiting request that does not fit
    for rank, view in enumerate(ordered):
        held = view.num_kv_blocks
        # Once the token budget is spent the rest only keep memory: skip pricing their work.
        if (token_left and (work := view.num_tokens_to_compute) and not view.loading
                and (admitting or not view.awaiting_admission)):
            limit = budget.early_limit(view, work, token_left, early_left)
            tokens = _tokens_that_fit(view, work, limit, block_left, budget) if limit else 0
            if tokens > 0:
                after = blocks_after(view, tokens, budget)
                chosen.append((rank, view, tokens, after))
                token_left -= tokens
                early_left -= 0 if view.complete else tokens
                block_left -= after
                continue
            # a stream held back by the early-prefill limit leaves vLLM's queues for the step
            # (the plug-in), so it does not end admission
            if limit and budget.admit_whole_sequence and view.awaiting_admission:
                admitting = False
        if held and held <= block_left:
            chosen.append((rank, view, 0, held))
            block_left -= held
    return chosen


def _first_that_fits_alone(ordered, capacity: int, budget: StepBudget) -> RequestView | None:
    for view in ordered:
        work = view.num_tokens_to_compute
        if work and _tokens_that_fit(view, work, budget.max_num_tokens, capacity, budget) > 0:
            return view
    return None


def plan_step(ordered: Sequence[RequestView], blocks: BlockManager, budget: StepBudget,
              cost: CostModel | None = None, swap_pool: SwapPool | None = None,
              num_held: int | None = None) -> StepDecision:
    """Plan one step over `ordered` (the policy's order of all waiting and running requests).

    `num_held`: the blocks the requests hold, each counted once (an engine whose requests share
    prefix blocks: vLLM); None: the sum of their views' blocks (nothing shared: the simulator)."""
    free = blocks.num_free()
    capacity = free + (sum(v.num_kv_blocks for v in ordered) if num_held is None else num_held)
    chosen = choose(ordered, budget, capacity, free)
    if any(tokens for _, _, tokens, _ in chosen):
        return _acquire(ordered, chosen, blocks, cost, swap_pool, _any_victim)
    # No progress in policy order (idle holders ahead of all work): put the first request that
    # fits on its own in front, so a step always computes when anything can.
    first = _first_that_fits_alone(ordered, capacity, budget)
    if first is None:
        return _acquire(ordered, chosen, blocks, cost, swap_pool, _any_victim)
    reordered = [first, *(v for v in ordered if v is not first)]
    return _acquire(reordered, choose(reordered, budget, capacity, free), blocks, cost, swap_pool, _no_work)


def _any_victim(view: RequestView) -> bool:
    return True


def _no_work(view: RequestView) -> bool:
    return not view.num_tokens_to_compute


def _victims(ordered, chosen, allowed):
    """(rank, view) of requests that hold blocks and were not chosen, lowest priority first (never
    one whose KV is being loaded: its blocks are the load's target)."""
    chosen_seqs = {view.seq for _, view, _, _ in chosen}
    for rank in range(len(ordered) - 1, -1, -1):
        view = ordered[rank]
        if view.num_kv_blocks and view.seq not in chosen_seqs and not view.loading and allowed(view):
            yield rank, view


def _acquire(ordered, chosen, blocks: BlockManager, cost, swap_pool, allowed) -> StepDecision:
    """Phase 2: allocate for the chosen set in order, evicting unchosen requests ranked below the
    one that needs the room, from the tail of the order, while an allocation does not fit."""
    decision = StepDecision()
    victims = _victims(ordered, chosen, allowed)
    pending = None  # a victim drawn but ranked too high for the request that drew it
    for rank, view, tokens, after in chosen:
        if not tokens:
            decision.num_kept += 1
            continue
        extra = after - view.num_kv_blocks
        while extra > 0 and not blocks.can_allocate(extra):
            pending = pending or next(victims, None)
            if pending is None or pending[0] < rank:
                break  # only higher-ranked requests are left to evict: no inversion
            _make_swap_room(pending[1], ordered, cost, swap_pool, decision)
            decision.preempted.append(_evict(pending[1], blocks, cost, swap_pool))
            pending = None
        if extra > 0 and not blocks.can_allocate(extra):
            continue
        if extra > 0:
            blocks.allocate(view.request_id, extra)
        if view.num_swapped_blocks and not view.num_kv_blocks:
            decision.swapped_in.append((view.request_id, view.num_swapped_blocks))
            if swap_pool is not None:
                swap_pool.free(view.request_id)
        decision.scheduled.append((view.request_id, tokens))
    return decision


def _make_swap_room(victim: RequestView, ordered, cost, swap_pool, decision: StepDecision) -> None:
    """Host memory goes to the requests whose clock runs first: when a completed prompt's eviction
    would swap but the pool is full, discard the swapped KV of blocked partial streams (they wait
    for a chunk or their question, seconds away), lowest ranked first, if that makes room. Each
    recomputes it when it runs again (under a policy that degrades evicted streams, at its
    question, as a one-shot request would); the completed prompt, whose TTFT or decode is on the
    clock now, comes back by a swap-in instead of a recompute. Only the simulator passes a pool."""
    if (not victim.complete or not swap_pays(victim, cost, swap_pool)
            or swap_pool.can_allocate(victim.num_kv_blocks)):
        return
    short, dropped = victim.num_kv_blocks - swap_pool.num_free(), []
    for view in reversed(ordered):
        if view.blocked and view.num_swapped_blocks and not view.num_kv_blocks:
            dropped.append((view.request_id, view.num_swapped_blocks))
            short -= view.num_swapped_blocks
            if short <= 0:
                break
    if short > 0:
        return  # the blocked streams do not hold enough: keep theirs, recompute the victim
    for request_id, _ in dropped:
        swap_pool.free(request_id)
    decision.dropped.extend(dropped)


def _evict(victim: RequestView, blocks: BlockManager, cost, swap_pool) -> Preemption:
    kind = choose_preemption_kind(victim, cost, swap_pool)
    if kind == SWAP:
        swap_pool.allocate(victim.request_id, victim.num_kv_blocks)
    freed = blocks.free(victim.request_id)
    return Preemption(victim.request_id, kind, freed, victim.num_computed_tokens)
