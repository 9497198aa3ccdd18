"""KV blocks as the scheduler plug-in's planner sees them in one vLLM step: how many are free for
it, whether the step may want more (only then is the planner asked), and a `BlockManager` that does
the planner's arithmetic while vLLM allocates. `scheduler` is the plug-in (`engine.vllm_scheduler`):
a vLLM `Scheduler` with the plug-in's `book` and `step_budget`."""

from __future__ import annotations

from scheduler.planner import blocks_after


class StepBlocks:
    """vLLM's free blocks as the planner's `BlockManager`: arithmetic only, vLLM allocates.

    Freeing a victim credits only the blocks that return to vLLM's pool: a block shared by prefix
    (a superseded request and its replacement, or two prompts with a common prefix) is freed
    when its last holder lets it go. `blocks_of(request_id)` gives the request's blocks, one list
    per KV cache group (vLLM's `KVCacheManager.get_blocks(...).blocks`), each with its reference
    count; without it (a plan over views alone) a victim is credited with all its blocks."""

    def __init__(self, num_free: int, views: dict, blocks_of=None):
        self._free, self._views, self._blocks_of = num_free, views, blocks_of
        self._holders: dict[int, int] = {}  # block id -> holders left once this plan's victims are freed

    def num_free(self) -> int:
        return self._free

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= self._free

    def allocate(self, request_id: str, num_blocks: int) -> None:
        self._free -= num_blocks

    def free(self, request_id: str, num_blocks: int | None = None) -> int:
        if num_blocks is not None:
            count = num_blocks
        elif self._blocks_of is None:
            count = self._views[request_id].num_kv_blocks
        else:
            count, holders = 0, self._holders
            for group in self._blocks_of(request_id):
                for block in group:
                    if block.is_null:
                        continue
                    left = holders.get(block.block_id, block.ref_cnt) - 1
                    holders[block.block_id] = left
                    count += left == 0
        self._free += count
        return count


def num_held(scheduler) -> int:
    """Blocks held by vLLM's requests, each counted once however many share it by prefix: the
    pool less its free blocks and its null block."""
    pool = scheduler.kv_cache_manager.block_pool
    return pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()


def blocks_of(scheduler):
    """The `blocks_of` of `StepBlocks` for a vLLM scheduler."""
    manager = scheduler.kv_cache_manager
    return lambda request_id: manager.get_blocks(request_id).blocks


def free_for_planner(scheduler) -> int:
    """vLLM's free blocks, less its admission watermark (`watermark`, 0 by default) while anything
    runs: vLLM then admits a waiting request only with the watermark left over."""
    manager = scheduler.kv_cache_manager
    free = manager.block_pool.get_num_free_blocks()
    return max(0, free - manager.watermark_blocks) if scheduler.running else free


def may_want_more_than(scheduler, free: int, with_work: int) -> bool:
    """Whether this step may want more than `free` blocks (then the planner is asked).

    A step allocates at most its token budget's worth of blocks plus a partial block per request
    (`with_work` of them). Under vLLM's whole-sequence admission a waiting request is admitted only
    when the blocks of its whole sequence (beyond those it holds) are free at that point of the
    step, though it allocates only its chunk's: a complete request back from eviction needs its
    whole prompt's blocks, far more than a step's budget, and were the planner not asked to evict
    for it, vLLM would spin with nothing to schedule. So the step wants at most the budget's blocks
    plus the largest such whole-sequence need; no sequence needs more than `max_model_len`'s
    blocks, so with that many free the waiting queues are not read at all.
    """
    budget, block_size = scheduler.step_budget, scheduler.block_size
    base = budget.max_num_tokens // block_size + 1 + with_work
    if base > free or not budget.admit_whole_sequence:
        return base > free
    if base + -(-scheduler.max_model_len // block_size) <= free:
        return False
    views, room = scheduler.book.views, free - base
    for queue in (scheduler.kv_holding_waiting, scheduler.waiting):
        for request in queue:
            view = views[request.request_id]  # awaiting admission: priced as the planner prices it
            if blocks_after(view, 0, budget) - view.num_kv_blocks > room:
                return True
    return False
