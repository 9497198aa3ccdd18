"""Shared fixtures. Engines are expensive (seconds to start): one per test session and model."""

import asyncio
import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Mechanics tests pin bfloat16 so that KV sizes in bytes mean the same token counts on every CPU
# (the engine's CPU default dtype follows the CPU: engine.engine_args.with_platform_defaults).
TINY_DTYPE = "bfloat16"
TINY_KV_BYTES = 8 << 20  # 512 blocks of 32 tokens for the tiny model: room for the mechanics tests


@pytest.fixture(scope="session")
async def tiny_engine():
    from engine.config import EngineConfig
    from engine.vllm_engine import create_engine

    engine = await create_engine(EngineConfig(model="tiny", dtype=TINY_DTYPE, max_model_len=2048,
                                              kv_cache_memory_bytes=TINY_KV_BYTES, answer_budget_tokens=32))
    yield engine
    await engine.shutdown()


@pytest.fixture(scope="session")
async def smol_engine():
    from engine.config import EngineConfig
    from engine.vllm_engine import create_engine

    engine = await create_engine(EngineConfig(model="smollm2", max_model_len=4096,
                                              kv_cache_memory_bytes=256 << 20))
    yield engine
    await engine.shutdown()


async def wait_for_kv_blocks(engine, expected: int, timeout_s: float = 10.0) -> int:
    """KV stats come from the engine's step reports: poll until they settle on `expected`."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    used = (await engine.stats()).kv_blocks_used
    while used != expected and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
        used = (await engine.stats()).kv_blocks_used
    return used


async def collect(deltas) -> tuple[list[int], str]:
    ids, text = [], ""
    async for delta in deltas:
        ids.extend(delta.token_ids)
        text += delta.text
    return ids, text


@pytest.fixture(scope="module")
def local_ray():
    """A one-CPU Ray of this process for a module's actor tests (no Serve, no engine)."""
    import ray

    ray.init(address="local", num_cpus=1, include_dashboard=False, namespace="stream2llm")
    try:
        yield
    finally:
        ray.shutdown()
