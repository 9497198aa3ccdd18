"""KV cache sizes of the engine benchmarks: stated in bfloat16 bytes, scaled to the dtype the engine runs in.

The engine's CPU dtype follows the CPU (float32 where bfloat16 is emulated), and a float32 KV cache
needs twice the bytes for the same tokens; a size stated in bytes alone would make a benchmark
measure a different memory pressure, or not start at all, on another CPU.
"""

from __future__ import annotations

from engine.models import KV_DTYPE_BYTES as DTYPE_BYTES


def kv_bytes(bfloat16_bytes: int, dtype: str) -> int:
    """Bytes that hold as many tokens in `dtype` as `bfloat16_bytes` do in bfloat16."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {sorted(DTYPE_BYTES)}")
    return bfloat16_bytes * DTYPE_BYTES[dtype] // DTYPE_BYTES["bfloat16"]
