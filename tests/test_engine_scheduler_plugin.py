"""The scheduler plug-in on a real vLLM scheduler in this process (no model: tests.sched_harness):
slots, policy order of vLLM's queues, eviction without inversion, clean-up of finished requests."""

import pytest
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import RequestStatus

from engine.vllm_scheduler import AsyncStreamingScheduler, StreamingScheduler
from engine.vllm_views import DEFERRED_TURN, RECOMPUTED_KEY
from scheduler.policies import POLICIES
from tests.sched_harness import BS, Driver, final, make_scheduler


def _idle(d: Driver, rid: str) -> bool:
    return rid in d.s.parked


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_idle_sessions_do_not_hold_slots(policy):
    s = make_scheduler(StreamingScheduler, policy, num_blocks=256, max_num_seqs=4)
    d = Driver(s)
    sessions = [f"s{i}" for i in range(12)]  # three times max_num_seqs
    for rid in sessions:
        d.turn(rid, 20)
    d.run_until(lambda: all(_idle(d, rid) for rid in sessions))
    assert s.num_waiting_for_streaming_input == 0 and not s.running
    assert s.get_num_unfinished_requests() == 0  # the engine core does not spin on idle sessions
    d.turn("oneshot", 30, final(3), resumable=False)
    d.turn("new", 25)
    d.turn("new", 5, final(3))
    d.end("new")
    d.run_until(lambda: "oneshot" not in s.requests and "new" not in s.requests)
    assert len(d.outputs["oneshot"]) == 3
    for rid in sessions:  # the idle sessions are intact: each still answers its question
        d.turn(rid, 5, final(2))
        d.end(rid)
    d.run_until(lambda: not any(rid in s.requests for rid in sessions))
    assert len(s.book) == 0 and not s.parked and not s.requests  # nothing outlives its request


@pytest.mark.parametrize("policy", ["lcas", "tailguard"])
def test_policy_orders_vllms_waiting_queue_and_running_list(policy):
    s = make_scheduler(StreamingScheduler, policy, num_blocks=256, max_num_seqs=8, log_stats=True)
    d = Driver(s)
    d.turn("partial", 300)  # a new partial stream; longer than one step's budget
    d.turn("question", 40, final(4), resumable=False)  # complete: ranked first, arrived later
    s.book.refresh()
    s._order_queues()
    assert [r.request_id for r in s.waiting] == ["question", "partial"]
    out = d.step()
    if policy == "lcas":  # no early-prefill limit: the rest of the budget, in rank order
        assert out.num_scheduled_tokens == {"question": 40, "partial": 256 - 40}
        assert [r.request_id for r in s.running] == ["question", "partial"]
        return
    # TailGuard limits early prefill to 1/32 of the budget while a completed prompt has work: the
    # partial chunk, bigger than that, sits out the step and is back in the queue after it
    assert out.num_scheduled_tokens == {"question": 40}
    assert [r.request_id for r in s.waiting] == ["partial"] and not s._held_back
    # vLLM makes the step's stats after `schedule` returned: the stream that sat out counts as waiting
    assert (d.stats.num_running_reqs, d.stats.num_waiting_reqs) == (1, 1)
    d.run_until(lambda: "question" not in s.requests)
    d.run_until(lambda: _idle(d, "partial"))
    assert s.requests["partial"].num_computed_tokens == 300


def test_streams_held_back_return_to_the_queue_when_vllms_step_fails(monkeypatch):
    s = make_scheduler(StreamingScheduler, "tailguard", num_blocks=256, max_num_seqs=8)
    d = Driver(s)
    d.turn("partial", 300)
    d.turn("question", 40, final(4), resumable=False)

    def failing_step(self, *args, **kwargs):
        assert [r.request_id for r in self.waiting] == ["question"]  # the stream sits out this step
        raise RuntimeError("step failed")

    monkeypatch.setattr(Scheduler, "schedule", failing_step)
    with pytest.raises(RuntimeError, match="step failed"):
        s.schedule()
    assert sorted(r.request_id for r in s.waiting) == ["partial", "question"] and not s._held_back


def test_early_prefill_within_the_allowance_runs_beside_a_decode():
    s = make_scheduler(StreamingScheduler, "tailguard", num_blocks=256, max_num_seqs=8)
    d = Driver(s)
    d.turn("question", 40, final(6), resumable=False)
    d.step()  # prefilled: it decodes from now on
    d.turn("small", 8)  # within the allowance (256 / 32 = 8 tokens)
    d.turn("big", 9)  # over it: waits while the question decodes
    out = d.step()
    assert out.num_scheduled_tokens == {"question": 1, "small": 8}
    d.run_until(lambda: "question" not in s.requests)
    d.run_until(lambda: _idle(d, "big"))


@pytest.mark.parametrize("question_tokens, small_runs", [(176, True), (216, False)])
def test_no_early_prefill_while_a_question_needs_more_blocks_than_are_free(question_tokens, small_runs):
    s = make_scheduler(StreamingScheduler, "tailguard", num_blocks=24, max_num_seqs=8)
    d = Driver(s)
    d.turn("holder", 160)  # 10 of the 23 usable blocks, idle from then on
    d.run_until(lambda: _idle(d, "holder"))
    d.turn("question", question_tokens, final(2), resumable=False)  # 11 or 14 blocks, 13 free
    d.turn("small", 8)  # within the early-prefill allowance (256 / 32)
    out = d.step()
    assert out.num_scheduled_tokens == ({"question": question_tokens, "small": 8} if small_runs
                                        else {"question": question_tokens})


def test_a_running_stream_sits_out_steps_where_a_question_has_work_and_keeps_its_slot():
    s = make_scheduler(StreamingScheduler, "tailguard", num_blocks=256, max_num_seqs=2)
    d = Driver(s)
    d.turn("partial", 300)
    assert d.step().num_scheduled_tokens == {"partial": 256}  # nothing else: the whole budget
    d.turn("question", 40, final(2), resumable=False)
    d.turn("other", 40, final(2), resumable=False)
    # the stream's last 44 tokens are over the allowance (256 / 32): vLLM would run them first
    assert d.step().num_scheduled_tokens == {"question": 40}
    # it kept its slot: the second question was not admitted past max_num_seqs
    assert [r.request_id for r in s.running] == ["question", "partial"]
    assert [r.request_id for r in s.waiting] == ["other"] and s.num_waiting_for_streaming_input == 0
    d.run_until(lambda: "question" not in s.requests and "other" not in s.requests)
    d.run_until(lambda: _idle(d, "partial"))
    assert s.requests["partial"].num_computed_tokens == 300


@pytest.mark.parametrize("policy", ["default_vllm", "tailguard"])
def test_turns_that_arrive_before_the_current_one_starts_are_prefilled_with_it(policy):
    """Not turn by turn (one step each, a throwaway sample between, re-admitted every time): the
    waiting turn takes the later ones in, each taken-in turn is acknowledged before the answer."""
    s = make_scheduler(StreamingScheduler, policy, num_blocks=64, max_num_seqs=4, budget=256)
    d = Driver(s)
    d.turn("s", 40)
    d.turn("s", 40)
    d.turn("s", 8, final(2))
    d.end("s")
    s.book.refresh()  # what the next step reads: one complete prompt
    assert s.requests["s"].num_prompt_tokens == 88 and s.book.views["s"].complete
    assert d.step().num_scheduled_tokens == {"s": 88}  # the whole prompt in one step
    d.run_until(lambda: "s" not in s.requests)
    assert d.stop_reasons["s"] == [DEFERRED_TURN, DEFERRED_TURN, None]
    assert d.outputs["s"][2:] == [7, 7]  # the answer follows the acknowledgements, whole
    # a turn already running is not extended: the next ones wait behind it, as in vLLM, and the
    # turn after it takes them all in
    d.turn("r", 300)
    d.step()
    d.turn("r", 10)
    d.turn("r", 10)
    d.turn("r", 4, final(2))
    d.end("r")
    assert s.requests["r"].num_prompt_tokens == 300 and len(s.requests["r"].streaming_queue) == 4
    d.run_until(lambda: d.stop_reasons.get("r"))  # the running turn ends
    assert s.requests["r"].num_prompt_tokens == 324 and list(s.requests["r"].streaming_queue) == [None]
    d.run_until(lambda: "r" not in s.requests)
    assert d.stop_reasons["r"] == [None, DEFERRED_TURN, DEFERRED_TURN, None] and d.outputs["r"][-2:] == [7, 7]


@pytest.mark.parametrize("policy", ["lcas", "tailguard"])
def test_eviction_takes_idle_memory_for_a_question_and_the_stream_resumes_whole(policy):
    s = make_scheduler(StreamingScheduler, policy, num_blocks=12, max_num_seqs=8)
    d = Driver(s)
    for rid in ("a", "b"):  # 5 blocks each, idle
        d.turn(rid, 5 * BS)
    d.run_until(lambda: _idle(d, "a") and _idle(d, "b"))
    held = s.requests["b"].num_computed_tokens
    d.turn("q", 5 * BS, final(2), resumable=False)  # needs 5 blocks, 2 free: evict one idle stream
    d.run_until(lambda: "q" not in s.requests)
    evicted = [rid for rid in ("a", "b") if s.requests[rid].num_computed_tokens == 0]
    assert len(evicted) == 1 and s.requests[evicted[0]].num_preemptions == 1
    # the evicted stream stays parked (blocked) until its next chunk, then recomputes everything
    victim = s.requests[evicted[0]]
    assert victim.status == RequestStatus.WAITING_FOR_STREAMING_REQ and s.book.views[evicted[0]].blocked
    d.turn(evicted[0], BS)
    assert victim.num_prompt_tokens == held + BS  # the throwaway token was trimmed exactly once
    if policy == "tailguard":  # degraded to one-shot: the chunk is acknowledged, not prefilled
        d.step()
        assert d.stop_reasons[evicted[0]][-1] == DEFERRED_TURN
        assert victim.num_computed_tokens == 0 and s.book.views[evicted[0]].blocked
    else:
        d.run_until(lambda: _idle(d, evicted[0]))
        assert victim.num_computed_tokens == held + BS
    # its final output reports the tokens computed again (the prefix cache kept some of them)
    d.turn(evicted[0], 4, final(2))
    d.end(evicted[0])
    d.run_until(lambda: evicted[0] not in s.requests)
    assert 0 < d.kv_params[evicted[0]][RECOMPUTED_KEY] <= held


def test_a_new_partial_stream_does_not_evict_resident_streams_under_tailguard():
    # a budget whose early-prefill allowance (1/32) admits these chunks beside the decode
    s = make_scheduler(StreamingScheduler, "tailguard", num_blocks=11, max_num_seqs=8, budget=8192)  # + null block
    d = Driver(s)
    d.turn("a", 4 * BS)
    d.turn("b", 3 * BS)
    d.run_until(lambda: _idle(d, "a") and _idle(d, "b"))
    d.turn("q", BS, final(40), resumable=False)  # a decoding request: the step has other work
    d.step()
    d.turn("new", 3 * BS)  # non-resident partial stream: band 4, takes free memory only
    d.step()
    assert s.requests["a"].num_computed_tokens == 4 * BS and s.requests["b"].num_computed_tokens == 3 * BS
    # 2 blocks free, 3 wanted: it waits whole (vLLM never runs part of a waiting request's sequence,
    # and the planner, under vLLM's rules, does not plan part of it either)
    assert s.requests["new"].num_computed_tokens == 0 and s.requests["q"].num_output_tokens == 2
    d.turn("a", 3 * BS)  # a's next chunk: resident with work (band 2) outranks idle b and evicts it
    d.step()
    assert s.requests["b"].num_computed_tokens == 0 and s.requests["a"].num_computed_tokens == 7 * BS
    assert s.requests["new"].num_computed_tokens == 0


def test_when_nothing_else_can_compute_a_new_stream_takes_idle_memory():
    # the planner's progress rule, as in the simulator (tests/test_scheduler_planner.py): idle
    # streams hold all memory and the new stream is the only work, so it evicts the tail idle one
    s = make_scheduler(StreamingScheduler, "tailguard", num_blocks=11, max_num_seqs=8)
    d = Driver(s)
    d.turn("a", 5 * BS)
    d.turn("b", 4 * BS)
    d.run_until(lambda: _idle(d, "a") and _idle(d, "b"))
    d.turn("new", 3 * BS)
    d.run_until(lambda: _idle(d, "new"))
    assert s.requests["new"].num_computed_tokens == 3 * BS
    evicted = [rid for rid in ("a", "b") if s.requests[rid].num_computed_tokens == 0]
    assert len(evicted) == 1


def test_async_scheduler_variant_runs_the_same_plan():
    s = make_scheduler(AsyncStreamingScheduler, "fcfs", num_blocks=64, max_num_seqs=4)
    d = Driver(s)
    d.turn("x", 20)
    d.run_until(lambda: _idle(d, "x"))
    assert s.num_waiting_for_streaming_input == 0


def test_a_session_whose_input_ends_while_idle_finishes_cleanly():
    """The end of a parked session's input can finish it inside vLLM's `add_request`; the plug-in's
    bookkeeping after that call must not expect the request to be there (a KeyError there killed the
    engine core in a demo run)."""
    s = make_scheduler(StreamingScheduler, "default_vllm", num_blocks=64, max_num_seqs=4)
    d = Driver(s)
    d.turn("idle", 20)
    d.run_until(lambda: "idle" in s.parked)
    d.end("idle")
    d.run_until(lambda: "idle" not in s.requests)
    assert len(s.book) == 0 and not s.parked


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_prompt_whose_whole_sequence_needs_idle_memory_is_admitted(policy):
    # Free blocks cover a step's budget (the plug-in's fast path), not the prompt's whole sequence,
    # which vLLM wants free before it admits it: the planner must still be asked to evict for it.
    s = make_scheduler(StreamingScheduler, policy, num_blocks=41, max_num_seqs=8)  # 40 + null block
    d = Driver(s)
    d.turn("a", 12 * BS)
    d.turn("b", 8 * BS)
    d.run_until(lambda: _idle(d, "a") and _idle(d, "b"))
    free = s.kv_cache_manager.block_pool.get_num_free_blocks()
    assert free >= s.step_budget.max_num_tokens // BS + 3  # the step's own need fits
    d.turn("q", 30 * BS, final(2), resumable=False)  # its whole sequence: 31 blocks
    d.run_until(lambda: "q" not in s.requests, max_steps=50)
    assert d.outputs["q"] == [7, 7]
    assert any(s.requests[rid].num_computed_tokens == 0 for rid in ("a", "b"))


def test_the_planner_keeps_vllms_watermark_free_for_admissions():
    # vLLM admits a waiting request only with its watermark of blocks left over while anything
    # runs: the planner must count it, or a prompt waits out a long decode beside idle streams
    s = make_scheduler(StreamingScheduler, "tailguard", num_blocks=41, max_num_seqs=8, watermark=0.25)
    assert s.kv_cache_manager.watermark_blocks == 10
    d = Driver(s)
    d.turn("a", 12 * BS)
    d.turn("b", 8 * BS)
    d.run_until(lambda: _idle(d, "a") and _idle(d, "b"))
    d.turn("r", BS - 4, final(40), resumable=False)  # a long decode: something runs
    d.step()
    d.turn("q", 10 * BS, final(2), resumable=False)  # 10 blocks: 19 are free, 10 of them the watermark
    d.run_until(lambda: "q" not in s.requests, max_steps=30)
    assert "r" in s.requests  # answered while the decode still runs
    assert any(s.requests[rid].num_computed_tokens == 0 for rid in ("a", "b"))
