"""The two-phase planner: budgets, victims from the tail, chosen never evicted, progress."""

import random

import pytest

from scheduler.blocks import BlockError, CountingBlockManager, SwapPool
from scheduler.cost_model import MeasuredCostModel, Curve
from scheduler.planner import PlannerError, StepBudget, plan_step
from scheduler.policies import POLICIES, make_policy
from scheduler.request import RequestView

BS = 16


def resident(blocks: CountingBlockManager, seq, *, computed, prompt=None, first=0.0,
             complete=False, admitted=None, gaps=()):
    v = RequestView(f"r{seq}", seq, first, first, prompt if prompt is not None else computed,
                    complete=complete, max_output_tokens=4, num_computed_tokens=computed,
                    running=True, admitted_seq=seq if admitted is None else admitted)
    v.num_kv_blocks = -(-computed // BS)
    blocks.allocate(v.request_id, v.num_kv_blocks)
    v.chunk_gaps.extend(gaps)
    return v


def waiting(seq, *, prompt, first=0.0, complete=True):
    return RequestView(f"r{seq}", seq, first, first, prompt, complete=complete, max_output_tokens=4)


def test_budgets_respected_and_victims_from_the_tail():
    blocks = CountingBlockManager(20)
    idle = [resident(blocks, i, computed=5 * BS, first=float(i)) for i in range(4)]  # 20 blocks
    newcomer = waiting(9, prompt=8 * BS, first=0.5)
    policy = make_policy("fcfs")
    decision = plan_step(policy.order([*idle, newcomer]), blocks, StepBudget(100, BS))
    assert decision.scheduled == [("r9", 100)]
    assert decision.num_scheduled_tokens <= 100
    # fcfs puts idle partial streams last; the latest-arrived is the tail and goes first
    assert [p.request_id for p in decision.preempted] == ["r3", "r2"]
    assert all(p.kind == "recompute" for p in decision.preempted)
    assert blocks.num_free() == 20 - 10 - 7


def test_never_evicts_a_request_chosen_this_step():
    blocks = CountingBlockManager(12)
    decoding = resident(blocks, 0, computed=4 * BS, prompt=4 * BS, complete=True)  # 4 blocks
    decoding.num_output_tokens = 1
    # prompt computed, one sampled token to feed back: a decode step needing a 5th block
    growing = resident(blocks, 1, computed=4 * BS, prompt=6 * BS)  # partial, 2 more blocks
    idle = resident(blocks, 2, computed=4 * BS)
    order = make_policy("lcas").order([idle, growing, decoding])
    decision = plan_step(order, blocks, StepBudget(1000, BS))
    scheduled = {rid for rid, _ in decision.scheduled}
    assert scheduled == {"r0", "r1"}
    assert [p.request_id for p in decision.preempted] == ["r2"]
    assert not scheduled & {p.request_id for p in decision.preempted}


def test_chunked_prefill_fills_the_token_budget_in_order():
    blocks = CountingBlockManager(1000)
    a, b = waiting(0, prompt=300, first=0.0), waiting(1, prompt=300, first=1.0)
    decision = plan_step(make_policy("fcfs").order([b, a]), blocks, StepBudget(400, BS))
    assert decision.scheduled == [("r0", 300), ("r1", 100)]
    assert blocks.held == {"r0": 19, "r1": 7}


def test_progress_when_idle_holders_block_default_vllm_order():
    # default_vllm keeps all running (idle) requests ahead of the waiting one: without the
    # progress rule nothing would ever run (the deadlock vLLM has with idle streaming sessions)
    blocks = CountingBlockManager(8)
    idle = [resident(blocks, i, computed=4 * BS) for i in range(2)]
    complete = waiting(5, prompt=3 * BS)
    decision = plan_step(make_policy("default_vllm").order([*idle, complete]), blocks,
                         StepBudget(512, BS))
    assert decision.scheduled == [("r5", 3 * BS)]
    assert [p.request_id for p in decision.preempted] == ["r1"]  # most recently admitted


def test_nothing_scheduled_when_no_request_fits_alone():
    blocks = CountingBlockManager(4)
    huge = waiting(0, prompt=10 * BS)
    decision = plan_step([huge], blocks, StepBudget(512, BS))
    assert decision.scheduled and decision.scheduled[0] == ("r0", 4 * BS)  # chunked to fit
    blocks2 = CountingBlockManager(4)
    swapped = waiting(1, prompt=10 * BS)
    swapped.num_computed_tokens, swapped.num_swapped_blocks = 5 * BS, 5  # cannot come back
    assert plan_step([swapped], blocks2, StepBudget(512, BS)).scheduled == []


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_random_states_keep_budgets_and_always_progress(name):
    rng, policy = random.Random(hash(name) % 1000), make_policy(name)
    for trial in range(40):
        blocks = CountingBlockManager(rng.randint(20, 60))
        views = []
        for seq in range(rng.randint(1, 12)):
            computed = rng.randint(0, 6) * BS
            if computed and blocks.can_allocate(computed // BS):
                views.append(resident(blocks, seq, computed=computed,
                                      prompt=computed + rng.choice([0, 0, 5, 40]),
                                      first=rng.random(), complete=rng.random() < 0.4,
                                      gaps=[rng.random()] * rng.randint(0, 2)))
            else:
                views.append(waiting(seq, prompt=rng.randint(1, 200), first=rng.random(),
                                     complete=rng.random() < 0.5))
        budget = StepBudget(rng.randint(1, 300), BS)
        held_before = {v.request_id: v.num_kv_blocks for v in views}
        decision = plan_step(policy.order(views), blocks, budget)
        assert decision.num_scheduled_tokens <= budget.max_num_tokens
        assert blocks.num_free() >= 0
        by_id = {v.request_id: v for v in views}
        for rid, tokens in decision.scheduled:
            v = by_id[rid]
            assert 0 < tokens <= v.num_tokens_to_compute
            assert blocks.held.get(rid, 0) * BS >= v.num_computed_tokens + tokens
        victims = {p.request_id for p in decision.preempted}
        assert not victims & {rid for rid, _ in decision.scheduled}
        # no priority inversion: a victim ranks below some scheduled request, or (progress
        # rule only) has nothing to compute
        rank = {v.request_id: i for i, v in enumerate(policy.order(views))}
        lowest_scheduled = max((rank[rid] for rid, _ in decision.scheduled), default=-1)
        for rid in victims:
            assert rank[rid] > min(rank[r] for r, _ in decision.scheduled) or \
                not by_id[rid].num_tokens_to_compute, (rid, lowest_scheduled)
        assert all(held_before[rid] for rid in victims)
        if any(v.num_tokens_to_compute for v in views):
            assert decision.scheduled, f"no progress in trial {trial}"


def test_swap_chosen_on_victim_size_only_while_pool_has_room():
    cost = MeasuredCostModel(Curve([(16, 0.016), (1600, 1.6)]), swap_out=Curve([(1, 0.001)]),
                             swap_in=Curve([(1, 0.001)]), block_size=BS)
    blocks, pool = CountingBlockManager(20), SwapPool(6)
    victims = [resident(blocks, i, computed=5 * BS, first=float(i)) for i in range(4)]
    newcomer = waiting(9, prompt=20 * BS)
    decision = plan_step(make_policy("fcfs").order([*victims, newcomer]), blocks,
                         StepBudget(1000, BS), cost, pool)
    kinds = [(p.request_id, p.kind) for p in decision.preempted]
    assert kinds == [("r3", "swap"), ("r2", "recompute"), ("r1", "recompute"), ("r0", "recompute")]
    assert pool.num_free() == 1 and pool.held == {"r3": 5}


def test_swap_not_chosen_when_recompute_of_the_victim_is_cheaper():
    # swapping is cheap per block but the victim has few computed tokens: recompute wins
    cost = MeasuredCostModel(Curve([(16, 0.0001), (1600, 0.01)]), swap_out=Curve([(1, 0.01)]),
                             swap_in=Curve([(1, 0.01)]), block_size=BS)
    blocks, pool = CountingBlockManager(10), SwapPool(100)
    victim = resident(blocks, 0, computed=10 * BS)
    decision = plan_step(make_policy("fcfs").order([victim, waiting(1, prompt=BS)]), blocks,
                         StepBudget(100, BS), cost, pool)
    assert [p.kind for p in decision.preempted] == ["recompute"]


def test_block_manager_rejects_bad_accounting():
    blocks = CountingBlockManager(4)
    with pytest.raises(BlockError):
        blocks.allocate("a", 5)
    blocks.allocate("a", 3)
    with pytest.raises(BlockError):
        blocks.free("a", 4)
    assert blocks.free("a", 1) == 1 and blocks.free("a") == 2 and blocks.num_free() == 4
    with pytest.raises(BlockError):
        CountingBlockManager(0)
    with pytest.raises(PlannerError):
        StepBudget(0, BS)


def test_tailguard_new_partial_stream_takes_only_free_memory():
    # a new partial stream ranks below resident idle streams: it waits for free memory instead of
    # evicting one (which would come back at its next chunk and evict another: ping-pong)
    blocks = CountingBlockManager(10)
    idle = [resident(blocks, i, computed=4 * BS, first=float(i), gaps=[1.0]) for i in range(2)]
    decoding = resident(blocks, 3, computed=2 * BS - 4, complete=True)
    decoding.num_output_tokens = 1  # one token to compute, inside its 2 blocks
    newcomer = waiting(5, prompt=3 * BS, first=3.0, complete=False)
    policy = make_policy("tailguard")
    decision = plan_step(policy.order([*idle, decoding, newcomer]), blocks, StepBudget(512, BS))
    assert decision.scheduled == [("r3", 1)] and decision.preempted == []
    # a complete request (its TTFT clock runs) ranks above them and may evict the tail idle one
    question = waiting(6, prompt=3 * BS, first=4.0, complete=True)
    decision = plan_step(policy.order([*idle, decoding, newcomer, question]), blocks,
                         StepBudget(512, BS))
    assert decision.scheduled == [("r3", 1), ("r6", 3 * BS), ("r5", BS)]  # r5: the free block
    assert [p.request_id for p in decision.preempted] == ["r1"]
    # with nothing else able to compute, the progress rule lets the newcomer take idle memory
    blocks = CountingBlockManager(8)
    idle = [resident(blocks, i, computed=4 * BS, first=float(i), gaps=[1.0]) for i in range(2)]
    decision = plan_step(policy.order([*idle, newcomer]), blocks, StepBudget(512, BS))
    assert decision.scheduled == [("r5", 3 * BS)] and [p.request_id for p in decision.preempted] == ["r1"]


def test_evicted_idle_stream_is_blocked_until_its_next_chunk():
    blocks = CountingBlockManager(4)
    stream = waiting(0, prompt=2 * BS, complete=False)
    stream.blocked = True  # evicted while idle: nothing to run until the next chunk
    assert stream.num_tokens_to_compute == 0 and stream.idle
    assert plan_step([stream], blocks, StepBudget(512, BS)).scheduled == []
    stream.record_chunk(1.0)
    stream.num_prompt_tokens += BS
    stream.unblock(degrade_evicted=True)  # a degrading policy keeps it waiting for its question
    assert stream.blocked
    stream.unblock(degrade_evicted=False)
    assert plan_step([stream], blocks, StepBudget(512, BS)).scheduled == [("r0", 3 * BS)]


VLLM_RULES = dict(whole_chunks=True, admit_whole_sequence=True)


def test_vllm_rules_never_plan_a_prefill_cut_to_free_memory():
    # 3 free blocks, a 6-block question: cut to memory it would run 3 blocks "without eviction",
    # which vLLM never schedules (it allocates the whole sequence of a waiting request or nothing)
    blocks = CountingBlockManager(8)
    idle = resident(blocks, 0, computed=5 * BS, first=0.0, gaps=[1.0])
    question = waiting(1, prompt=6 * BS, first=1.0)
    question.awaiting_admission = True
    order = make_policy("tailguard").order([idle, question])
    simulated = plan_step(order, CountingBlockManager(3), StepBudget(2 * BS, BS))
    assert simulated.scheduled == [("r1", 2 * BS)] and simulated.preempted == []
    decision = plan_step(order, blocks, StepBudget(2 * BS, BS, **VLLM_RULES))
    assert decision.scheduled == [("r1", 2 * BS)]  # the token budget still chunks it
    assert [p.request_id for p in decision.preempted] == ["r0"]  # room for all 6 blocks
    assert blocks.num_free() == 8 - 6


def test_vllm_rules_stop_admission_at_the_first_waiting_request_that_does_not_fit():
    def plan(small_is_running: bool):
        blocks = CountingBlockManager(6)
        decoding = resident(blocks, 0, computed=4 * BS, prompt=4 * BS, complete=True)
        decoding.num_output_tokens = 1  # its decode takes a 5th block: 1 left
        big = waiting(1, prompt=5 * BS, first=1.0)  # only the decoding request could make room
        small = waiting(2, prompt=BS, first=2.0)  # fits in the block left
        big.awaiting_admission, small.awaiting_admission = True, not small_is_running
        order = make_policy("fcfs").order([decoding, big, small])
        return plan_step(order, blocks, StepBudget(512, BS, **VLLM_RULES))

    # vLLM's waiting loop stops at `big`: `small` waits although it fits
    assert plan(small_is_running=False).scheduled == [("r0", 1)]
    # a request already in the running list is scheduled before any waiting one
    assert plan(small_is_running=True).scheduled == [("r0", 1), ("r2", BS)]


EARLY = dict(early_prefill_tokens=2 * BS)


def _question_and_streams():
    blocks = CountingBlockManager(64)
    decoding = resident(blocks, 0, computed=4 * BS, prompt=4 * BS, complete=True)
    decoding.num_output_tokens = 1  # a decode: its client's clock runs
    streams = [waiting(i, prompt=3 * BS, first=float(i), complete=False) for i in (1, 2)]
    return blocks, decoding, streams


def test_early_prefill_is_limited_while_a_completed_prompt_has_work():
    blocks, decoding, streams = _question_and_streams()
    order = make_policy("fcfs").order([decoding, *streams])
    # the simulator cuts the first stream's chunk to the allowance; the second gets nothing
    decision = plan_step(order, blocks, StepBudget(512, BS, **EARLY))
    assert decision.scheduled == [("r0", 1), ("r1", 2 * BS)]
    # under vLLM's rules a chunk is not cut to the allowance: it waits whole, and does not end admission
    blocks, decoding, streams = _question_and_streams()
    for view in streams:
        view.awaiting_admission = True
    streams[1].num_prompt_tokens = BS
    decision = plan_step(make_policy("fcfs").order([decoding, *streams]), blocks,
                         StepBudget(512, BS, **VLLM_RULES, **EARLY))
    assert decision.scheduled == [("r0", 1), ("r2", BS)]


def test_early_prefill_takes_the_whole_budget_when_no_clock_runs():
    blocks, _, streams = _question_and_streams()
    decision = plan_step(make_policy("fcfs").order(streams), blocks, StepBudget(512, BS, **EARLY))
    assert decision.scheduled == [("r1", 3 * BS), ("r2", 3 * BS)]
    with pytest.raises(PlannerError):
        StepBudget(512, BS, early_prefill_tokens=-1)


def _question_beside_an_idle_stream(question_blocks: int):
    blocks = CountingBlockManager(12)
    question = resident(blocks, 0, computed=8 * BS, prompt=question_blocks * BS, complete=True)
    holder = resident(blocks, 1, computed=2 * BS)  # an idle stream; 2 blocks stay free
    stream = waiting(2, prompt=BS, first=1.0, complete=False)
    return blocks, make_policy("fcfs").order([question, holder, stream])


def test_no_early_prefill_while_the_completed_prompts_need_more_memory_than_is_free():
    budget = StepBudget(512, BS, **EARLY)
    blocks, order = _question_beside_an_idle_stream(9)  # 1 block to go, 2 free
    assert budget.early_allowance(order, blocks.num_free()) == 2 * BS
    assert plan_step(order, blocks, budget).scheduled == [("r0", BS), ("r2", BS)]
    blocks, order = _question_beside_an_idle_stream(11)  # 3 to go: what the stream took, it would lose
    assert budget.early_allowance(order, blocks.num_free()) == 0
    decision = plan_step(order, blocks, budget)
    assert decision.scheduled == [("r0", 3 * BS)]
    assert [p.request_id for p in decision.preempted] == ["r1"]


def test_tailguard_limits_early_prefill_and_the_paper_policies_do_not():
    assert make_policy("tailguard").early_prefill_tokens(8192) == 256
    assert all(make_policy(name).early_prefill_tokens(8192) is None
               for name in POLICIES if name != "tailguard")


def _swapped_blocked_stream(pool: SwapPool, seq: int, num_blocks: int) -> RequestView:
    stream = waiting(seq, prompt=num_blocks * BS, complete=False)
    stream.num_computed_tokens, stream.num_swapped_blocks, stream.blocked = num_blocks * BS, num_blocks, True
    pool.allocate(stream.request_id, num_blocks)
    return stream


def _evict_for_a_question(victim_complete: bool, pool: SwapPool, held_by_streams: list[RequestView]):
    cost = MeasuredCostModel(Curve([(16, 0.016), (1600, 1.6)]), swap_out=Curve([(1, 0.001)]),
                             swap_in=Curve([(1, 0.001)]), block_size=BS)
    blocks = CountingBlockManager(8)
    victim = resident(blocks, 1, computed=4 * BS, complete=victim_complete)
    question = waiting(0, prompt=8 * BS)  # ranked first: takes the whole step and all 8 blocks
    return plan_step([question, victim, *held_by_streams], blocks, StepBudget(8 * BS, BS), cost, pool)


def test_a_completed_prompt_takes_the_swap_pool_from_blocked_streams():
    pool = SwapPool(4)
    stream = _swapped_blocked_stream(pool, 5, 4)
    decision = _evict_for_a_question(True, pool, [stream])
    assert decision.dropped == [("r5", 4)]
    assert [(p.request_id, p.kind) for p in decision.preempted] == [("r1", "swap")]
    assert pool.held == {"r1": 4}


def test_swap_pool_kept_by_blocked_streams_for_a_partial_victim_or_too_little_room():
    pool = SwapPool(4)
    stream = _swapped_blocked_stream(pool, 5, 4)
    decision = _evict_for_a_question(False, pool, [stream])  # an idle stream's KV: not on a clock
    assert decision.dropped == [] and [p.kind for p in decision.preempted] == ["recompute"]
    assert pool.held == {"r5": 4}
    pool = SwapPool(5)
    small = _swapped_blocked_stream(pool, 5, 2)
    pool.allocate("r6", 3)  # a completed prompt's swapped KV: never discarded
    decision = _evict_for_a_question(True, pool, [small])
    assert decision.dropped == [] and [p.kind for p in decision.preempted] == ["recompute"]
    assert pool.held == {"r5": 2, "r6": 3}
