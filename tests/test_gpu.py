"""GPU suite (`pytest -m gpu`, or `scripts/gpu_check.sh`): the CUDA path of the engine and retriever.

Deselected on CPU machines (`scripts/test.sh` runs `-m "not gpu"`). Each test fails, rather than
skips, when it is selected on a machine without a CUDA GPU: a GPU run that quietly tests nothing
would read as green. The one skip is the tensor-parallel test on a machine with a single GPU.
None of these has run yet: no GPU has been lent to the project. What they lean on was checked on
CPU: KV caches are sized from the model's config (`engine.models.kv_cache_bytes`, checked against
vLLM's accounting in tests/test_engine_kv_sizing.py), and the eviction scenario
(`tests.eviction_scenario`) passes on the CPU engine (tests/test_engine_eviction_order.py).
"""

import asyncio
import uuid

import numpy as np
import pytest

from engine.api import SamplingConfig
from engine.config import EngineConfig
from engine.models import kv_cache_bytes
from tests import eviction_scenario
from tests.conftest import collect

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]
GREEDY = SamplingConfig(max_tokens=16)


def _cuda_devices() -> int:
    import torch

    if not torch.cuda.is_available():
        pytest.fail("a gpu-marked test was selected, but torch sees no CUDA GPU")
    return torch.cuda.device_count()


MAX_MODEL_LEN = 2048
CHUNK = 1024  # tokens per chunk of the eviction scenario


def _gpu_config(**fields) -> EngineConfig:
    _cuda_devices()
    return EngineConfig(**{"model": "smollm2", "platform": "cuda", "max_model_len": MAX_MODEL_LEN,
                           "gpu_memory_utilization": 0.3, "dtype": "float32", **fields})


def _pressure_config(**fields) -> EngineConfig:
    """A cache of `eviction_scenario.CACHE_CHUNKS` chunks, sized from SmolLM2's config (float32)."""
    tokens = int(eviction_scenario.CACHE_CHUNKS * CHUNK)
    return _gpu_config(gpu_memory_utilization=None, kv_cache_memory_bytes=kv_cache_bytes("smollm2", "float32", tokens),
                       **fields)


# ~25 tokens per line: 4 chunks of 12 lines stay under MAX_MODEL_LEN with the question
def _session_chunks(engine, session: int, chunks: int = 4, words: int = 12) -> list[list[int]]:
    return [engine.tokenize(" ".join(f"doc {session}.{c} line {w}: value {(session * 31 + c * 7 + w) % 97}."
                                     for w in range(words))) for c in range(chunks)]


async def _streamed_and_one_shot(engine, sessions: int, gap_s: float = 0.02):
    """Streamed answers of concurrent sessions and their one-shot answers (fresh cache salt)."""
    question = engine.tokenize("Question: which value does the first line hold?")

    async def stream(chunks):
        sid = await engine.open_session()
        for chunk in chunks:
            await engine.append(sid, token_ids=chunk)
            await asyncio.sleep(gap_s)
        return (await collect(engine.finish(sid, token_ids=question, sampling=GREEDY)))[0]

    all_chunks = [_session_chunks(engine, s) for s in range(sessions)]
    streamed = await asyncio.gather(*(stream(c) for c in all_chunks))
    one_shot = [(await collect(engine.generate(token_ids=sum(c, []) + question, sampling=GREEDY,
                                               cache_salt=uuid.uuid4().hex)))[0] for c in all_chunks]
    return streamed, one_shot


async def test_streaming_equals_one_shot_under_cuda_graphs():
    from engine.vllm_engine import create_engine

    engine = await create_engine(_gpu_config())
    try:
        assert not engine._llm.vllm_config.model_config.enforce_eager  # CUDA graphs on by default
        streamed, one_shot = await _streamed_and_one_shot(engine, sessions=4)
        assert streamed == one_shot
    finally:
        await engine.shutdown()


@pytest.mark.parametrize("policy", ["fcfs", "tailguard"])
async def test_eviction_follows_the_policy_under_async_scheduling(policy):
    """The plug-in over vLLM's `AsyncScheduler` (the GPU default): the latest idle stream is evicted
    for a one-shot prompt, the earliest keeps its KV, every answer equals its one-shot answer; then
    24 streamed sessions several times the cache all answer exactly."""
    from engine.vllm_engine import create_engine
    from engine.vllm_scheduler import AsyncStreamingScheduler

    engine = await create_engine(_pressure_config(policy=policy))
    try:
        assert engine._llm.vllm_config.scheduler_config.get_scheduler_cls() is AsyncStreamingScheduler
        result = await asyncio.wait_for(eviction_scenario.run(engine, CHUNK), 300)
        eviction_scenario.assert_evicted_in_policy_order(result)
        streamed, one_shot = await asyncio.wait_for(_streamed_and_one_shot(engine, sessions=24), 300)
        assert streamed == one_shot
    finally:
        await engine.shutdown()


@pytest.mark.parametrize("swap_in_s_per_block, loaded", [(None, True), (1e-6, True), (1.0, False)],
                         ids=["plain", "cheap-load", "dear-load"])
async def test_offloaded_kv_is_loaded_back_or_recomputed_by_the_cost_model(tmp_path, swap_in_s_per_block, loaded):
    """The evicted stream's KV comes back from the host pool (plain offload, or the cost model
    pricing a load cheap): it recomputes at most its last blocks; priced dear, it recomputes what the prefix cache lost."""
    from engine.vllm_engine import create_engine
    from scheduler.cost_model import build_cost_model, save_cost_model

    cost_path = None
    if swap_in_s_per_block is not None:
        swap = [(1, swap_in_s_per_block), (1000, 1000 * swap_in_s_per_block)]
        cost_path = tmp_path / "cost.json"
        save_cost_model(build_cost_model([(16, 0.001), (4096, 0.05)], block_size=16, device="cuda",
                                         model="smollm2", swap_out=swap, swap_in=swap), cost_path)
    engine = await create_engine(_pressure_config(policy="fcfs", kv_offload_gib=2.0,
                                                  cost_model_path=str(cost_path) if cost_path else None))
    try:
        assert engine._llm.vllm_config.kv_transfer_config is not None
        result = await asyncio.wait_for(eviction_scenario.run(engine, CHUNK), 300)
        block_size = (await engine.stats()).block_size
    finally:
        await engine.shutdown()
    assert result["answers"] == result["expected"] and result["preemptions"] > 0
    evicted = result["recomputed"][-1]
    assert (evicted <= max(2 * block_size, CHUNK // 8)) if loaded else (evicted > CHUNK // 4), result["recomputed"]


async def test_calibrate_measures_the_swap_side_with_offload():
    from engine.calibration import calibrate

    config = _gpu_config(gpu_memory_utilization=None, kv_cache_memory_bytes=1 << 30, kv_offload_gib=2.0,
                         answer_budget_tokens=1)
    document = await calibrate(config, sizes=(256, 1024), repeats=2, batches=(1,))
    assert document["swap_in"] and document["swap_out"] and document["device"].startswith("cuda")
    assert all(seconds >= 0 for _, seconds in document["swap_in"])


async def test_tensor_parallel_two_gpus_matches_one_gpu():
    if _cuda_devices() < 2:
        pytest.skip("tensor parallelism needs two GPUs; this machine has one")
    from engine.vllm_engine import create_engine

    outputs = []
    for tp in (1, 2):
        engine = await create_engine(_gpu_config(tensor_parallel_size=tp, distributed_executor_backend="mp"))
        try:
            outputs.append(await _streamed_and_one_shot(engine, sessions=2))
        finally:
            await engine.shutdown()
    assert outputs[0] == outputs[1]


def test_faiss_gpu_search_equals_cpu_search():
    _cuda_devices()
    import faiss

    from retrievers.vector import to_gpu_if_available

    rng = np.random.default_rng(0)
    data = rng.standard_normal((20_000, 384), dtype=np.float32)
    faiss.normalize_L2(data)
    quantizer = faiss.IndexFlatIP(384)
    index = faiss.IndexIVFFlat(quantizer, 384, 64, faiss.METRIC_INNER_PRODUCT)
    index.train(data)
    index.add(data)
    index.nprobe = 64  # every list: exact search on both devices
    gpu_index, _resources = to_gpu_if_available(index)
    assert gpu_index is not None, "faiss-gpu is not installed or sees no GPU"
    queries = data[rng.choice(len(data), 64, replace=False)] + 0.01
    _, cpu_ids = index.search(queries, 10)
    _, gpu_ids = gpu_index.search(queries, 10)
    recall = np.mean([len(set(c) & set(g)) / 10 for c, g in zip(cpu_ids, gpu_ids)])
    assert recall == 1.0
