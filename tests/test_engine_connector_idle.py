"""Parked sessions with a KV connector configured: the engine core must not step empty batches.

vLLM's `has_finished_requests()` takes, once a connector is set, every request in none of its queues
for one whose connector clean-up is pending, and `has_requests()` stays true: the engine core then
steps for as long as a session is parked. The connector here is vLLM's `ExampleConnector` (KV saved
to and loaded from files), whose scheduler side vLLM builds on CPU; the driver plays the engine
core's loop, which steps while `has_requests()` holds. The `OffloadingConnector` that
`kv_offload_gib` configures also builds on CPU, but its scheduler side keeps the engine stepping
until its worker side reports each store done (`has_pending_push_work`), which needs the CUDA
worker: the GPU check runs the engine with it (tests/test_gpu.py)."""

import pytest
from vllm.config import KVTransferConfig

from engine.vllm_scheduler import AsyncStreamingScheduler, StreamingScheduler
from tests.sched_harness import Driver, final, make_scheduler


def file_connector(path) -> KVTransferConfig:
    return KVTransferConfig(kv_connector="ExampleConnector", kv_role="kv_both",
                            kv_connector_extra_config={"shared_storage_path": str(path)})


def _core_steps(d: Driver, limit: int = 50) -> int:
    """Steps the engine core's busy loop runs before it blocks on its input queue."""
    steps = 0
    while (d.s.has_requests() or d.in_flight) and steps < limit:
        d.step()
        steps += 1
    return steps


@pytest.mark.parametrize("cls, depth", [(StreamingScheduler, 1), (AsyncStreamingScheduler, 2)],
                         ids=["sync", "async"])
def test_parked_sessions_do_not_make_the_core_spin(cls, depth, tmp_path):
    s = make_scheduler(cls, "tailguard", num_blocks=128, max_num_seqs=4, kv_transfer_config=file_connector(tmp_path))
    assert s.connector is not None
    d = Driver(s, depth=depth)
    for rid in ("a", "b", "c"):
        d.turn(rid, 40)
    _core_steps(d)
    assert set(s.parked) == {"a", "b", "c"} and len(s.requests) == 3
    assert not s.has_finished_requests() and not s.has_requests()
    assert _core_steps(d) == 0  # the step count stays flat while the sessions wait
    d.turn("a", 8, final(2))  # a session's question: the core steps again, then stops
    d.end("a")
    assert 0 < _core_steps(d) < 50
    assert "a" not in s.requests and _core_steps(d) == 0
