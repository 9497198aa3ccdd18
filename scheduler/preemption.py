"""Recompute or swap, decided per victim on the victim's own KV size.

The paper's version priced the incoming request's tokens and assumed unlimited host memory; here
the price is the victim's (its computed tokens vs its blocks) and a swap needs room in the pool.
"""

from __future__ import annotations

from scheduler.blocks import SwapPool
from scheduler.cost_model import CostModel
from scheduler.request import RequestView

RECOMPUTE, SWAP = "recompute", "swap"


def choose_preemption_kind(victim: RequestView, cost: CostModel | None,
                           swap_pool: SwapPool | None) -> str:
    if swap_pays(victim, cost, swap_pool) and swap_pool.can_allocate(victim.num_kv_blocks):
        return SWAP
    return RECOMPUTE


def swap_pays(victim: RequestView, cost: CostModel | None, swap_pool: SwapPool | None) -> bool:
    """Whether moving the victim's KV out and back costs less than recomputing it (room aside)."""
    if cost is None or swap_pool is None or not cost.swap_available:
        return False
    blocks = victim.num_kv_blocks
    return cost.swap_out_s(blocks) + cost.swap_in_s(blocks) < cost.recompute_s(victim.num_computed_tokens)


def choose_resume_kind(num_tokens: int, block_size: int, cost: CostModel | None) -> str:
    """For a request resuming with `num_tokens` of its KV offloaded to host memory: load it back
    (SWAP) or recompute it, priced on this request's own size.

    The swap-out already happened while the KV was computed (vLLM's offloading stores blocks as
    they fill), so only the swap-in is weighed. Without swap measurements the load is kept.
    """
    if num_tokens <= 0 or cost is None or not cost.swap_available:
        return SWAP
    blocks = -(-num_tokens // block_size)
    return SWAP if cost.swap_in_s(blocks) <= cost.recompute_s(num_tokens) else RECOMPUTE
