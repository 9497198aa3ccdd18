"""A request whose KV a connector is loading (`WAITING_FOR_REMOTE_KVS`) is never evicted: its
blocks are the load's target, and vLLM waits for the load to end before it looks at it again. The
connector is `tests.kv_load_connector` (an async hit for `load-` requests), built by vLLM."""

import pytest
from vllm.config import KVTransferConfig
from vllm.v1.request import RequestStatus

from engine.vllm_scheduler import AsyncStreamingScheduler, StreamingScheduler
from scheduler.planner import StepBudget, plan_step
from scheduler.request import RequestView
from tests.sched_harness import BS, Driver, final, make_scheduler

LOADER = KVTransferConfig(kv_connector="AsyncLoadConnector", kv_role="kv_both",
                          kv_connector_module_path="tests.kv_load_connector",
                          kv_connector_extra_config={"shared_storage_path": "/nonexistent-stream2llm"})


class _Blocks:
    def __init__(self, free):
        self.free_blocks = free

    def num_free(self):
        return self.free_blocks

    def can_allocate(self, n):
        return n <= self.free_blocks

    def allocate(self, request_id, n):
        self.free_blocks -= n

    def free(self, request_id, num_blocks=None):
        return 0


def test_the_planner_never_picks_a_loading_request_as_victim():
    """The pure planner: a question needs the blocks that only a lower-ranked loading request holds."""
    question = RequestView("q", 0, 1.0, 1.0, 64, complete=True, max_output_tokens=2)
    loading = RequestView("l", 1, 2.0, 2.0, 160, num_computed_tokens=144, num_kv_blocks=9,
                          running=True, awaiting_admission=True, loading=True)
    budget = StepBudget(256, BS)
    assert not plan_step([question, loading], _Blocks(2), budget).preempted
    loading.loading = False  # the same request, its load done: now it may go
    assert [p.request_id for p in plan_step([question, loading], _Blocks(2), budget).preempted] == ["l"]


@pytest.mark.parametrize("cls, depth", [(StreamingScheduler, 1), (AsyncStreamingScheduler, 2)],
                         ids=["sync", "async"])
@pytest.mark.parametrize("policy", ["fcfs", "tailguard"])
def test_a_request_whose_kv_load_is_in_flight_keeps_its_blocks(policy, cls, depth):
    s = make_scheduler(cls, policy, num_blocks=20, max_num_seqs=8, kv_transfer_config=LOADER)
    d = Driver(s, depth=depth)
    d.turn("load-s", 10 * BS)  # a partial stream: 9 blocks of KV found outside, loading
    d.run_until(lambda: s.requests["load-s"].status == RequestStatus.WAITING_FOR_REMOTE_KVS)
    blocks = s.kv_cache_manager.get_block_ids("load-s")[0]
    assert len(blocks) == 9
    d.turn("q", 10 * BS, final(2), resumable=False)  # ranked above it; 11 blocks wanted, 10 free
    for _ in range(6):  # the load takes a while: the question waits, the loading stream keeps its blocks
        d.step()
        load = s.requests["load-s"]
        assert load.status == RequestStatus.WAITING_FOR_REMOTE_KVS and load.num_preemptions == 0
        assert s.kv_cache_manager.get_block_ids("load-s")[0] == blocks
    d.loaded.add("load-s")  # the worker reports the load done
    d.run_until(lambda: "q" not in s.requests and "load-s" in s.parked)
    assert d.outputs["q"] == [7, 7]
