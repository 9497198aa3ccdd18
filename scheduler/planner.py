"""The two-phase scheduling step, as a pure planner (no I/O, in the spirit of vLLM v1's
SchedulerInterface).

Phase 1 walks the policy's order and picks the set that fits the token budget and the KV-block
budget (capacity = free blocks + blocks held by the listed requests): requests with work get tokens
(chunked when the budget is short), resident requests that fit keep their blocks. Phase 2 acquires
the blocks of that set through the block manager, evicting from the tail of the order among running
requests not chosen, until the allocation fits. Phase 1's accounting guarantees phase 2 terminates.
The planner never touches the views: the owner applies the returned decision.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from scheduler.blocks import BlockManager, SwapPool
from scheduler.cost_model import CostModel
from scheduler.preemption import SWAP, choose_preemption_kind
from scheduler.request import RequestView


class PlannerError(RuntimeError):
    """The inputs break the planner's accounting (a bug in the owner, not a capacity problem)."""


@dataclass(frozen=True)
class StepBudget:
    max_num_tokens: int
    block_size: int

    def __post_init__(self) -> None:
        if self.max_num_tokens <= 0 or self.block_size <= 0:
            raise PlannerError(f"budget must be positive: {self}")


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
    num_kept: int = 0  # resident requests that keep their blocks without computing

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(tokens for _, tokens in self.scheduled)


def _blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


def choose(ordered: Sequence[RequestView], budget: StepBudget, capacity: int) -> list[tuple]:
    """Phase 1: (view, tokens, blocks held after the step) for every request that keeps memory."""
    chosen = []
    token_left, block_left, bs = budget.max_num_tokens, capacity, budget.block_size
    for view in ordered:
        held = view.num_kv_blocks
        # Once the token budget is spent the rest only keep memory: skip pricing their work.
        if token_left and (work := view.num_tokens_to_compute):
            computed = view.num_computed_tokens
            tokens = min(work, token_left, block_left * bs - computed)
            if tokens > 0:
                after = max(held, _blocks_for(computed + tokens, bs))
                chosen.append((view, tokens, after))
                token_left -= tokens
                block_left -= after
                continue
        if held and held <= block_left:
            chosen.append((view, 0, held))
            block_left -= held
    return chosen


def _first_that_fits_alone(ordered, capacity: int, block_size: int) -> RequestView | None:
    for view in ordered:
        if view.num_tokens_to_compute and _blocks_for(view.num_computed_tokens + 1, block_size) <= capacity:
            return view
    return None


def plan_step(ordered: Sequence[RequestView], blocks: BlockManager, budget: StepBudget,
              cost: CostModel | None = None, swap_pool: SwapPool | None = None) -> StepDecision:
    """Plan one step over `ordered` (the policy's order of all waiting and running requests)."""
    capacity = blocks.num_free() + sum(v.num_kv_blocks for v in ordered)
    chosen = choose(ordered, budget, capacity)
    if not any(tokens for _, tokens, _ in chosen):
        # No progress in policy order (idle holders ahead of all work): put the first request
        # that fits on its own in front, so a step always computes when anything can.
        first = _first_that_fits_alone(ordered, capacity, budget.block_size)
        if first is not None:
            chosen = choose([first, *(v for v in ordered if v is not first)], budget, capacity)
    return _acquire(ordered, chosen, blocks, cost, swap_pool)


def _acquire(ordered, chosen, blocks: BlockManager, cost, swap_pool) -> StepDecision:
    """Phase 2: allocate for the chosen set in order, evicting unchosen running requests from the
    tail of the order while an allocation does not fit."""
    decision = StepDecision()
    chosen_seqs = {view.seq for view, _, _ in chosen}
    victims = (v for v in reversed(ordered) if v.num_kv_blocks and v.seq not in chosen_seqs)
    for view, tokens, after in chosen:
        if not tokens:
            decision.num_kept += 1
            continue
        extra = after - view.num_kv_blocks
        while extra > 0 and not blocks.can_allocate(extra):
            victim = next(victims, None)
            if victim is None:
                raise PlannerError(f"no victim left to fit {extra} blocks for {view.request_id}")
            decision.preempted.append(_evict(victim, blocks, cost, swap_pool))
        if extra > 0:
            blocks.allocate(view.request_id, extra)
        if view.num_swapped_blocks and not view.num_kv_blocks:
            decision.swapped_in.append((view.request_id, view.num_swapped_blocks))
            if swap_pool is not None:
                swap_pool.free(view.request_id)
        decision.scheduled.append((view.request_id, tokens))
    return decision


def _evict(victim: RequestView, blocks: BlockManager, cost, swap_pool) -> Preemption:
    kind = choose_preemption_kind(victim, cost, swap_pool)
    if kind == SWAP:
        swap_pool.allocate(victim.request_id, victim.num_kv_blocks)
    freed = blocks.free(victim.request_id)
    return Preemption(victim.request_id, kind, freed, victim.num_computed_tokens)
