"""The simulator against the real engine, in small: one smollm2 engine measures its own cost model,
then a burst of one-shot requests queues behind each other on it; the simulator, given that cost model and
the engine's block and token budgets, must predict the TTFTs within a factor of two.

A burst is used because its TTFTs are sums of many step times (queueing), which the cost model
prices, rather than one step's jitter, which a shared 2-core machine makes noisy. smollm2, not the
tiny model: the tiny model's steps are so short that the fixed per-request latency in a calibrated
lone-request TTFT (which the engine overlaps across a burst) dominates them. The full
comparison (streaming, every policy, smollm2) is `python -m bench.engine_policies`.
"""

import numpy as np

from bench.engine_replay import replay
from engine.calibration import measure_cost_model
from engine.config import EngineConfig
from stream2llm.data.traces import ContextOp, PromptMode, QueryTrace, TraceEvent, poisson_arrivals
from scheduler.cost_model import MeasuredCostModel
from scheduler.simulator import SimConfig, SimEngineConfig, simulate

REQUESTS, PROMPT, QUESTION, BUDGET = 6, 480, 16, 512
BURST_QPS = 1e6  # all requests at once
FACTOR = 2.0  # stated tolerance: simulated / measured TTFT mean and p90 within [1/2, 2]


def _burst() -> list[QueryTrace]:
    return [QueryTrace(f"burst-{i}", "crawler", "burst", (TraceEvent(0.0, 0.0, ContextOp.APPEND, PROMPT),),
                       QUESTION, 2) for i in range(REQUESTS)]


async def test_simulated_ttft_of_a_burst_matches_the_engine():
    from engine.vllm_engine import create_engine

    config = EngineConfig(model="smollm2", max_model_len=1024, kv_cache_memory_bytes=96 << 20,
                          max_num_batched_tokens=BUDGET, answer_budget_tokens=8)
    engine = await create_engine(config)
    try:
        cost = MeasuredCostModel.from_json(
            await measure_cost_model(engine, config, (64, 256, 512), 3, (1, 8)))
        stats = await engine.stats()
        traces = _burst()
        arrivals = poisson_arrivals(REQUESTS, BURST_QPS, 0)
        measured = (await replay(engine, traces, arrivals, streaming=False))["ttft_s"]
    finally:
        await engine.shutdown()
    sim_config = SimConfig("default_vllm", PromptMode.ONESHOT,
                           SimEngineConfig(stats.kv_blocks_total, stats.block_size, BUDGET), 1, BURST_QPS, 0)
    predicted = simulate(traces, sim_config, cost).ttft_s
    assert len(predicted) == len(measured) == REQUESTS
    # queueing: the last request of the burst waits for the others in both
    assert max(measured) > 3 * min(measured) and max(predicted) > 3 * min(predicted)
    for stat in (np.mean, lambda x: np.percentile(x, 90)):
        ratio = stat(predicted) / stat(measured)
        assert 1 / FACTOR <= ratio <= FACTOR, f"sim/engine TTFT ratio {ratio:.2f}"
