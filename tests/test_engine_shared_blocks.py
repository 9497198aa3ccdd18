"""Blocks freed by an eviction, as the planner counts them, when victims share prefix blocks: a
superseded request and its replacement (an update's new context keeps the old one's prefix, found
in vLLM's prefix cache) hold the same blocks, and evicting the old one frees only its own."""

from vllm import SamplingParams
from vllm.v1.request import Request

from engine.vllm_scheduler import StreamingScheduler
from engine.vllm_step_blocks import StepBlocks, blocks_of
from engine.vllm_views import OPENED_ARG, PARTIAL_TURN_ARG, SUPERSEDES_ARG
from tests.sched_harness import BLOCK_HASHER, BS, Driver, final, make_scheduler

OLD, NEW = "s2l-old-1a2b3c4d", "s2l-new-5e6f7a8b"


def _superseded_pair(d: Driver) -> None:
    """OLD: 10 blocks, idle. NEW replaces it: the same first 8 blocks (shared) and 2 of its own."""
    tokens = list(range(100, 100 + 10 * BS))
    replace = SamplingParams(max_tokens=1, temperature=0.0, extra_args={
        PARTIAL_TURN_ARG: True, OPENED_ARG: 1.0, SUPERSEDES_ARG: "s2l-old"})
    d.s.add_request(Request(OLD, tokens, SamplingParams(max_tokens=1, temperature=0.0,
                                                        extra_args={PARTIAL_TURN_ARG: True}),
                            None, arrival_time=1.0, resumable=True, block_hasher=BLOCK_HASHER))
    d.run_until(lambda: OLD in d.s.parked)
    d.s.add_request(Request(NEW, tokens[:8 * BS] + list(range(900, 900 + 2 * BS)), replace, None,
                            arrival_time=2.0, resumable=True, block_hasher=BLOCK_HASHER))
    d.run_until(lambda: NEW in d.s.parked)


def test_a_victim_is_credited_only_with_the_blocks_it_alone_holds():
    s = make_scheduler(StreamingScheduler, "fcfs", num_blocks=24, max_num_seqs=8)
    d = Driver(s)
    _superseded_pair(d)
    assert s.kv_cache_manager.block_pool.get_num_free_blocks() == 23 - 12  # 8 blocks shared
    s.book.refresh()
    blocks = StepBlocks(11, s.book.views, blocks_of(s))
    assert blocks.free(OLD) == 2  # its 8 shared blocks stay with the replacement
    assert blocks.free(NEW) == 10  # then the replacement's go, the shared ones included
    assert blocks.num_free() == 23
    assert StepBlocks(11, s.book.views).free(OLD) == 10  # views alone cannot tell


def test_a_question_evicts_enough_in_one_step_when_the_superseded_request_shares_blocks():
    s = make_scheduler(StreamingScheduler, "fcfs", num_blocks=24, max_num_seqs=8)
    d = Driver(s)
    _superseded_pair(d)
    d.turn("q", 14 * BS, final(2), resumable=False)  # 14 blocks: 11 free, 2 more from OLD alone
    out = d.step()
    assert out.num_scheduled_tokens == {"q": 14 * BS}  # admitted at once: both evicted this step
    assert s.requests[OLD].num_computed_tokens == 0 and s.requests[NEW].num_computed_tokens == 0
    d.run_until(lambda: "q" not in s.requests)
    assert d.outputs["q"] == [7, 7]
