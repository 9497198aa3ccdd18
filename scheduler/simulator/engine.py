"""One simulated engine: request views, the policy's order, device blocks, the swap pool, and a
step whose duration comes from the cost model.

It calls the same `scheduler.planner.plan_step` on the same kind of views as the vLLM plug-in
(`engine.vllm_scheduler`), and applies the decision as is: the scheduled set runs with its tokens.
The plug-in can only steer vLLM (it orders vLLM's queues and evicts the planner's victims), so the
engine differs where vLLM's structure forces it; the plug-in's docstring lists how. As in the
plug-in, a stream evicted while idle stays blocked until its next chunk, or until its question
under a policy that degrades evicted streams (`RequestView.blocked`, `engine.vllm_sessions`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.blocks import CountingBlockManager, SwapPool
from scheduler.cost_model import CostModel
from scheduler.planner import StepBudget, StepDecision, plan_step
from scheduler.policies import Policy
from scheduler.preemption import SWAP
from scheduler.queue import PolicyQueue
from scheduler.request import RequestView


@dataclass(frozen=True)
class SimEngineConfig:
    num_blocks: int
    block_size: int = 16
    max_num_tokens: int = 8192
    swap_pool_blocks: int = 0


@dataclass
class SimEngineStats:
    preemptions: dict[str, int] = field(default_factory=lambda: {"recompute": 0, "swap": 0})
    tokens_invalidated: int = 0
    tokens_recomputed: int = 0
    swaps_dropped: int = 0  # swapped KV discarded for a completed prompt's (`planner._make_swap_room`)
    tokens_computed: int = 0
    steps: int = 0
    busy_s: float = 0.0


@dataclass
class StepOutcome:
    duration_s: float
    first_tokens: list[str]  # requests whose first output token comes at the end of this step
    finished: list[str]


class SimEngine:
    def __init__(self, policy: Policy, cost: CostModel, config: SimEngineConfig):
        self.cost, self.config = cost, config
        self.queue = PolicyQueue(policy)
        self.degrade = policy.degrade_evicted_streams
        self.blocks = CountingBlockManager(config.num_blocks)
        self.swap_pool = SwapPool(config.swap_pool_blocks if cost.swap_available else 0)
        self.budget = StepBudget(config.max_num_tokens, config.block_size,
                                 early_prefill_tokens=policy.early_prefill_tokens(config.max_num_tokens))
        self.views: dict[str, RequestView] = {}
        self._high_water: dict[str, int] = {}  # tokens once computed and still valid content
        self._admissions = 0
        self.stats = SimEngineStats()

    def add_request(self, view: RequestView) -> None:
        self.views[view.request_id] = view
        self._high_water[view.request_id] = 0
        self.queue.touch(view)

    def append(self, request_id: str, now: float, num_tokens: int, complete: bool) -> None:
        view = self.views[request_id]
        view.record_chunk(now)
        view.num_prompt_tokens += num_tokens
        view.complete = complete
        view.unblock(self.degrade)
        self.queue.touch(view)

    def replace(self, request_id: str, now: float, num_tokens: int, keep_tokens: int,
                complete: bool) -> None:
        """Update mode: a new context of `num_tokens`; KV beyond `keep_tokens` (the LCP) is void."""
        view = self.views[request_id]
        view.record_chunk(now)
        keep = min(view.num_computed_tokens, keep_tokens)
        self.stats.tokens_invalidated += view.num_computed_tokens - keep
        view.num_computed_tokens = keep
        view.num_prompt_tokens = num_tokens
        view.complete = complete
        view.unblock(self.degrade)
        self._high_water[request_id] = min(self._high_water[request_id], keep)
        need = -(-keep // self.config.block_size)
        if view.num_kv_blocks > need:
            self.blocks.free(request_id, view.num_kv_blocks - need)
            view.num_kv_blocks = need
            view.running = need > 0
        if view.num_swapped_blocks > need:
            self.swap_pool.free(request_id, view.num_swapped_blocks - need)
            view.num_swapped_blocks = need
        self.queue.touch(view)

    def step(self, now: float) -> StepOutcome | None:
        """Plan and apply one step at `now`; None when there is nothing to compute."""
        decision = plan_step(self.queue.ordered(), self.blocks, self.budget, self.cost,
                             self.swap_pool)
        swap_s = self._apply_preemptions(decision)
        if not decision.scheduled:
            return None
        swap_s += sum(self.cost.swap_in_s(b) for _, b in decision.swapped_in)
        for request_id, _ in decision.swapped_in:
            self.views[request_id].num_swapped_blocks = 0
        outcome = self._apply_scheduled(decision, now)
        outcome.duration_s += swap_s
        self.stats.steps += 1
        self.stats.busy_s += outcome.duration_s
        return outcome

    def _apply_preemptions(self, decision: StepDecision) -> float:
        for request_id, _ in decision.dropped:
            view = self.views[request_id]
            view.num_swapped_blocks = view.num_computed_tokens = 0
            self.stats.swaps_dropped += 1
            self.queue.touch(view)
        swap_s = 0.0
        for p in decision.preempted:
            view = self.views[p.request_id]
            # as in the plug-in: a stream evicted while idle waits for its next chunk (for its
            # question under a policy that degrades evicted streams, `RequestView.unblock`)
            view.blocked = view.idle
            self.stats.preemptions[p.kind] += 1
            view.num_preemptions += 1
            view.num_kv_blocks, view.running = 0, False
            if p.kind == SWAP:
                view.num_swapped_blocks = p.num_blocks
                swap_s += self.cost.swap_out_s(p.num_blocks)
            else:
                view.num_computed_tokens = 0
            self.queue.touch(view)
        return swap_s

    def _apply_scheduled(self, decision: StepDecision, now: float) -> StepOutcome:
        prefill = pairs = cached_pairs = decode_seqs = decode_kv = 0
        first_tokens, finished = [], []
        held, high_water, views = self.blocks.held, self._high_water, self.views
        for request_id, tokens in decision.scheduled:
            view = views[request_id]
            computed = view.num_computed_tokens
            if computed >= view.num_known_tokens - 1 and view.num_output_tokens:
                decode_seqs += 1
                decode_kv += computed
            else:
                prefill += tokens
                pairs += tokens * (computed + tokens / 2)
                cached_pairs += tokens * computed
            self.stats.tokens_recomputed += max(0, min(high_water[request_id], computed + tokens) - computed)
            view.num_computed_tokens = computed + tokens
            high_water[request_id] = max(high_water[request_id], computed + tokens)
            view.num_kv_blocks = held.get(request_id, 0)
            if not view.running:
                self._admissions += 1
                view.running, view.admitted_seq, view.admitted_at = True, self._admissions, now
            if view.complete and view.num_computed_tokens == view.num_known_tokens:
                view.num_output_tokens += 1
                if view.num_output_tokens == 1:
                    first_tokens.append(request_id)
                if view.finished:
                    finished.append(request_id)
                    self._finish(view)
                    continue
            self.queue.touch(view)
        self.stats.tokens_computed += prefill + decode_seqs
        duration = self.cost.step_s(prefill, pairs, decode_seqs, decode_kv, cached_pairs)
        return StepOutcome(duration, first_tokens, finished)

    def _finish(self, view: RequestView) -> None:
        self.blocks.free(view.request_id)
        self.swap_pool.free(view.request_id)
        self.queue.remove(view)
        del self.views[view.request_id]
        del self._high_water[view.request_id]

    @property
    def num_active(self) -> int:
        return len(self.views)
