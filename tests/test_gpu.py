"""GPU suite (`pytest -m gpu`, or `scripts/gpu_check.sh`): the CUDA path of the engine and retriever.

Deselected on CPU machines (`scripts/test.sh` runs `-m "not gpu"`). Each test fails, rather than
skips, when it is selected on a machine without a CUDA GPU: a GPU run that quietly tests nothing
would read as green. The one skip is the tensor-parallel test on a machine with a single GPU.
"""

import asyncio
import uuid

import numpy as np
import pytest

from engine.api import SamplingConfig
from engine.config import EngineConfig
from tests.conftest import collect

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]
GREEDY = SamplingConfig(max_tokens=16)


def _cuda_devices() -> int:
    import torch

    if not torch.cuda.is_available():
        pytest.fail("a gpu-marked test was selected, but torch sees no CUDA GPU")
    return torch.cuda.device_count()


def _gpu_config(**fields) -> EngineConfig:
    _cuda_devices()
    return EngineConfig(**{"model": "smollm2", "platform": "cuda", "max_model_len": 4096,
                           "gpu_memory_utilization": 0.3, "dtype": "float32", **fields})


def _session_chunks(engine, session: int, chunks: int = 4, words: int = 120) -> list[list[int]]:
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


async def test_scheduler_plugin_runs_under_async_scheduling_with_kv_pressure():
    from engine.vllm_engine import create_engine
    from engine.vllm_scheduler import AsyncStreamingScheduler

    engine = await create_engine(_gpu_config(policy="tailguard", gpu_memory_utilization=None,
                                             kv_cache_memory_bytes=64 << 20))
    try:
        scheduler_config = engine._llm.vllm_config.scheduler_config
        assert scheduler_config.async_scheduling, "vLLM's GPU default is async scheduling"
        assert scheduler_config.get_scheduler_cls() is AsyncStreamingScheduler
        streamed, one_shot = await asyncio.wait_for(_streamed_and_one_shot(engine, sessions=24), 300)
        assert streamed == one_shot
        assert (await engine.stats()).preemptions > 0, "the cache was sized to force evictions"
    finally:
        await engine.shutdown()


@pytest.mark.parametrize("swap_in_s_per_block", [None, 1e-6, 1.0])
async def test_kv_offload_under_pressure_answers_stay_exact(tmp_path, swap_in_s_per_block):
    """Plain offload (None), and the cost-aware connector with loading priced cheap or dear."""
    from engine.vllm_engine import create_engine
    from scheduler.cost_model import build_cost_model, save_cost_model

    cost_path = None
    if swap_in_s_per_block is not None:
        swap = [(1, swap_in_s_per_block), (1000, 1000 * swap_in_s_per_block)]
        cost_path = tmp_path / "cost.json"
        save_cost_model(build_cost_model([(16, 0.001), (4096, 0.05)], block_size=16, device="cuda",
                                         model="smollm2", swap_out=swap, swap_in=swap), cost_path)
    engine = await create_engine(_gpu_config(policy="tailguard", gpu_memory_utilization=None,
                                             kv_cache_memory_bytes=64 << 20, kv_offload_gib=2.0,
                                             cost_model_path=str(cost_path) if cost_path else None))
    try:
        transfer = engine._llm.vllm_config.kv_transfer_config
        assert transfer is not None  # vLLM's CPU offloading connector, or ours over it
        assert (transfer.kv_connector == "CostAwareOffloadingConnector") == (cost_path is not None)
        streamed, one_shot = await asyncio.wait_for(_streamed_and_one_shot(engine, sessions=24), 300)
        assert streamed == one_shot
        assert (await engine.stats()).preemptions > 0
    finally:
        await engine.shutdown()


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
