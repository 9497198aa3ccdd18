"""Views under vLLM's async scheduling (the GPU default), on the real `AsyncScheduler` with no model:
the driver schedules the next step before the last one's output is back, as the engine core's batch
queue does, so requests are viewed with output placeholders (tokens sampled by steps in flight).

A decode, or a question just after its prefill, must show its token of work then: with none it
would rank with the requests that have nothing to compute (last, under FCFS, LCAS and MCPS, where
vLLM's `running[-1]` preempts first) and TailGuard would not see its clock run. Each case runs the
synchronous scheduler in lockstep too: the async one must plan as it does."""

import pytest

from engine.vllm_scheduler import AsyncStreamingScheduler, StreamingScheduler
from tests.sched_harness import Driver, final, make_scheduler

# Running order after the second step, both running with work: the question (complete, decoding,
# 200 computed) and a partial stream's first chunk (600 tokens, 56 computed, arrived later).
EXPECTED_RUNNING = {"fcfs": ["q", "s"], "lcas": ["q", "s"], "mcps": ["q", "s"]}


def _pair(policy: str, async_scheduling: bool) -> Driver:
    cls = AsyncStreamingScheduler if async_scheduling else StreamingScheduler
    d = Driver(make_scheduler(cls, policy, num_blocks=256, max_num_seqs=8), depth=2 if async_scheduling else 1)
    d.turn("q", 200, final(8), resumable=False)
    d.turn("s", 600)
    return d


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "lockstep"])
@pytest.mark.parametrize("policy", sorted(EXPECTED_RUNNING))
def test_a_decode_in_flight_keeps_its_rank(policy, async_scheduling):
    d = _pair(policy, async_scheduling)
    s = d.s
    assert d.step().num_scheduled_tokens == {"q": 200, "s": 56}  # q's prefill ends: it samples
    placeholders = s.requests["q"].num_output_placeholders
    assert placeholders == (1 if async_scheduling else 0) and s.requests["q"].num_output_tokens == 1 - placeholders
    second = d.step()  # async: scheduled before the first step's output is back
    assert second.num_scheduled_tokens == {"q": 1, "s": 255}
    view = s.book.views["q"]
    assert view.num_tokens_to_compute == 1 and not view.finished  # its decode is work
    assert [r.request_id for r in s.running] == EXPECTED_RUNNING[policy]
    d.run_until(lambda: "q" not in s.requests and "s" in s.parked)
    assert d.outputs["q"] == [7] * 8 and s.requests["s"].num_computed_tokens == 600


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "lockstep"])
def test_tailguard_allowance_sees_a_decode_in_flight(async_scheduling):
    """While the question decodes, a partial stream gets at most the early-prefill allowance (256 /
    32 tokens): its 600-token chunk sits out every step of the decode, in flight or not."""
    d = _pair("tailguard", async_scheduling)
    s = d.s
    assert d.step().num_scheduled_tokens == {"q": 200}  # a completed prompt has work: s waits
    for _ in range(7):  # the decode: s sits out each step, the output of the last one in flight or not
        out = d.step()
        if out is not None and out.total_num_scheduled_tokens:
            assert out.num_scheduled_tokens == {"q": 1}
        assert s.requests["s"].num_computed_tokens == 0
    d.run_until(lambda: "q" not in s.requests)
    assert d.outputs["q"] == [7] * 8
    d.run_until(lambda: "s" in s.parked)
    assert s.requests["s"].num_computed_tokens == 600


def test_in_flight_samples_that_reach_max_tokens_are_no_work():
    """A request whose steps in flight will sample its last token has nothing left to compute
    (vLLM schedules no further step for it): it must not rank as work waiting for the budget."""
    s = make_scheduler(AsyncStreamingScheduler, "fcfs", num_blocks=64, max_num_seqs=4)
    d = Driver(s, depth=2)
    d.turn("q", 40, final(1), resumable=False)
    d.step()  # its prefill samples its only token; the output is in flight
    s.book.refresh()
    view = s.book.views["q"]
    assert s.requests["q"].num_output_placeholders == 1
    assert view.finished and view.num_tokens_to_compute == 0
    d.run_until(lambda: "q" not in s.requests)
    assert d.outputs["q"] == [7]
