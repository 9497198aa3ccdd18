"""Parametric cost model for GPUs we cannot measure here, from first principles.

Assumptions (stated, not measured):
- Prefill is compute-bound: FLOPs = 2 x matmul parameters per token (all parameters but the input
  embedding and the LM head, which runs only for sampled tokens) plus attention, 4 x layers x
  (heads x head_dim) per (query token, context token) pair; run at a fixed fraction
  of the dense BF16 peak (`achievable_fraction`, i.e. the MFU vLLM reaches on long prefills).
- Decode is memory-bound: each step reads the weights once plus the KV of every decoding request,
  at a fraction of peak HBM bandwidth. A mixed step costs max(compute time, memory time).
- Every step pays a fixed scheduler/launch overhead.
- Swap copies whole KV blocks over the host link at an effective bandwidth well below the link's
  nominal rate (paged blocks are small scattered copies).
- KV capacity: `gpu_memory_utilization` of HBM, minus weights and an activation/workspace reserve.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    name: str
    num_params: float
    num_embedding_params: float  # vocab x hidden (untied input embedding; the LM head is as big)
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int = 2

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> float:
        return self.num_params * self.dtype_bytes


@dataclass(frozen=True)
class GpuShape:
    name: str
    memory_bytes: float
    peak_flops: float  # dense BF16
    achievable_fraction: float
    hbm_bytes_per_s: float
    hbm_fraction: float
    host_link_bytes_per_s: float  # effective, per direction
    step_overhead_s: float
    gpu_memory_utilization: float = 0.9
    activation_reserve_bytes: float = 4e9


# Llama-3.1-8B: 32 layers, 32 query heads, 8 KV heads of 128 dims, BF16: 128 KiB of KV per token.
LLAMA31_8B = ModelShape("llama-3.1-8b", 8.03e9, 128256 * 4096, 32, 32, 8, 128)
# H200 SXM: 141 GB HBM3e, 989 TFLOP/s dense BF16, 4.8 TB/s, PCIe Gen5 x16 to the host (64 GB/s
# nominal). Assumed: 70% MFU on prefill, 80% of HBM bandwidth on decode, 20 GB/s effective for
# paged swap copies, 2 ms of per-step overhead.
H200 = GpuShape("h200", 141e9, 989e12, 0.70, 4.8e12, 0.80, 20e9, 0.002)


class ParametricCostModel:
    swap_available = True

    def __init__(self, gpu: GpuShape = H200, model: ModelShape = LLAMA31_8B, block_size: int = 16):
        self.gpu, self.model, self.block_size = gpu, model, block_size
        self._flops_per_s = gpu.peak_flops * gpu.achievable_fraction
        self._bytes_per_s = gpu.hbm_bytes_per_s * gpu.hbm_fraction
        self._prefill_flops = 2.0 * (model.num_params - 2 * model.num_embedding_params)
        self._decode_flops = 2.0 * (model.num_params - model.num_embedding_params)
        self._attn_flops = 4.0 * model.num_layers * model.num_heads * model.head_dim
        self._block_bytes = block_size * model.kv_bytes_per_token

    def kv_capacity_tokens(self) -> int:
        g = self.gpu
        free = g.memory_bytes * g.gpu_memory_utilization - self.model.weight_bytes
        return max(0, int((free - g.activation_reserve_bytes) // self.model.kv_bytes_per_token))

    def kv_capacity_blocks(self) -> int:
        return self.kv_capacity_tokens() // self.block_size

    def recompute_s(self, num_tokens: int) -> float:
        return self.step_s(num_tokens, num_tokens * num_tokens / 2.0, 0, 0)

    def swap_out_s(self, num_blocks: int) -> float:
        return num_blocks * self._block_bytes / self.gpu.host_link_bytes_per_s

    swap_in_s = swap_out_s

    def step_s(self, prefill_tokens: int, attention_pairs: float, decode_seqs: int,
               decode_kv_tokens: int, cached_pairs: float = 0.0) -> float:
        # cached_pairs is a part of attention_pairs, which this model prices as flops already
        flops = (self._prefill_flops * prefill_tokens + self._decode_flops * decode_seqs
                 + self._attn_flops * (attention_pairs + decode_kv_tokens))
        read = self.model.weight_bytes + decode_kv_tokens * self.model.kv_bytes_per_token
        return max(flops / self._flops_per_s, read / self._bytes_per_s) + self.gpu.step_overhead_s

    def describe(self) -> dict:
        return {"gpu": self.gpu.__dict__, "model": self.model.__dict__,
                "block_size": self.block_size, "kv_capacity_tokens": self.kv_capacity_tokens()}


PRESETS = {"h200": lambda: ParametricCostModel(H200, LLAMA31_8B)}
