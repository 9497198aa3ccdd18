"""Eviction order on the real engine (tiny model, CPU): `tests.eviction_scenario`, which the GPU
suite runs on SmolLM2 under async scheduling and CUDA graphs."""

import pytest

from engine.config import EngineConfig
from engine.models import kv_cache_bytes
from tests import eviction_scenario

CHUNK = 1024


@pytest.mark.parametrize("policy", ["fcfs", "tailguard"])
async def test_idle_streams_are_evicted_from_the_tail_of_the_policys_order(policy):
    from engine.vllm_engine import create_engine

    tokens = int(eviction_scenario.CACHE_CHUNKS * CHUNK)
    engine = await create_engine(EngineConfig(model="tiny", dtype="float32", max_model_len=2048, policy=policy,
                                              kv_cache_memory_bytes=kv_cache_bytes("tiny", "float32", tokens)))
    try:
        result = await eviction_scenario.run(engine, CHUNK)
    finally:
        await engine.shutdown()
    eviction_scenario.assert_evicted_in_policy_order(result)
    assert result["preemptions"] > 0
