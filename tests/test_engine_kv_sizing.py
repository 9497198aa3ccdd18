"""KV cache sizes computed from a model's config (`engine.models.kv_cache_bytes`): the GPU tests size
their caches this way, so the formula is checked here against vLLM's own accounting on CPU."""

import pytest

from engine.config import EngineConfig
from engine.models import kv_bytes_per_token, kv_cache_bytes


def test_bytes_per_token_from_the_model_config():
    assert kv_bytes_per_token("tiny", "float32") == 2 * 2 * 1 * 64 * 4  # 2 layers, 1 KV head of 64
    # SmolLM2-135M: 30 layers, 3 KV heads of 64: 4,096 tokens in float32 need 180 MiB
    assert kv_cache_bytes("smollm2", "float32", 4096) == 180 << 20
    assert kv_bytes_per_token("smollm2", "bfloat16") == kv_bytes_per_token("smollm2", "float32") // 2
    with pytest.raises(ValueError, match="unknown KV dtype"):
        kv_bytes_per_token("tiny", "int3")


async def test_vllm_gives_the_tokens_the_bytes_were_sized_for():
    from engine.vllm_engine import create_engine

    tokens = 4608
    engine = await create_engine(EngineConfig(model="smollm2", dtype="float32", max_model_len=2048,
                                              kv_cache_memory_bytes=kv_cache_bytes("smollm2", "float32", tokens)))
    try:
        stats = await engine.stats()
        capacity = stats.kv_blocks_total * stats.block_size
        assert tokens - 2 * stats.block_size <= capacity <= tokens
    finally:
        await engine.shutdown()
