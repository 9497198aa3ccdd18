"""`EngineConfig` -> vLLM engine arguments, with per-platform defaults and contradiction checks.

Every setting reaches vLLM unchanged; only the ones left at `None` get a platform default:

| setting | CPU (measured safe on 2 cores) | GPU |
|---|---|---|
| distributed_executor_backend | "uni": one worker (vLLM's CPU platform runs it as "mp" unless V1 multiprocessing is off) | vLLM's choice ("ray" in a placement group) |
| enforce_eager | True | False: CUDA graphs on |
| kv_cache_memory_bytes | 1 GiB | unset: `gpu_memory_utilization` sizes the cache |
| block_size | 32 (the CPU attention backend needs a multiple of 32) | vLLM's default |
| async_scheduling | off | vLLM's default |
| dtype | bfloat16 where the CPU computes it natively (AVX512-BF16 or AMX), else float32 | "auto": the model's own |

Why dtype depends on the CPU: without native bfloat16 PyTorch emulates it, and prefill runs several
times slower than in float32 (`python -m bench.cpu_dtype`; figures in `docs/BENCHMARKS_COMPONENTS.md`, "CPU dtype").

The pure part (`resolve_engine_args`) is unit-tested for both platforms on a CPU machine.
"""

from __future__ import annotations

import os
from dataclasses import replace

from engine.config import EngineConfig, EngineConfigError

CPU_KV_CACHE_BYTES = 1 << 30
CPU_BLOCK_SIZE = 32
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})

# Engine arguments that EngineConfig owns; `extra_engine_args` may not set them behind its back.
OWNED_ARGS = frozenset({
    "model", "tokenizer", "served_model_name", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
    "enable_prefix_caching", "seed", "dtype", "block_size", "kv_cache_memory_bytes",
    "gpu_memory_utilization", "tensor_parallel_size", "pipeline_parallel_size",
    "distributed_executor_backend", "enforce_eager", "async_scheduling", "kv_offloading_size",
    "kv_offloading_backend", "scheduler_cls", "additional_config", "disable_log_stats",
})


def detect_platform() -> str:
    """"cuda" when vLLM's platform is a CUDA(-like) GPU, else "cpu"."""
    from vllm.platforms import current_platform

    return "cuda" if current_platform.is_cuda_alike() else "cpu"


def resolve_platform(config: EngineConfig, detected: str) -> str:
    """The platform to build for; an explicit choice the machine cannot honour is an error."""
    if config.platform == "auto":
        return detected
    if config.platform == "cuda" and detected != "cuda":
        raise EngineConfigError("platform='cuda' but vLLM sees no CUDA GPU here (install stream2llm[gpu] "
                                "on a GPU machine, or use platform='cpu')")
    return config.platform


def cpuinfo_field(name: str, cpuinfo: str = "/proc/cpuinfo") -> str | None:
    """The first `name` line's value in /proc/cpuinfo (None where there is none, or no such file)."""
    try:
        with open(cpuinfo) as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith(name)), None)
    except OSError:
        return None


def cpu_has_native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU computes bfloat16 in hardware (AVX512-BF16 or AMX-BF16)."""
    return bool(NATIVE_BF16_FLAGS & set((cpuinfo_field("flags", cpuinfo) or "").split()))


def with_platform_defaults(config: EngineConfig, platform: str, cpu_bf16: bool = False) -> EngineConfig:
    """`config` with every `None` setting filled for `platform`; contradictions raise EngineConfigError.

    `cpu_bf16`: the CPU computes bfloat16 natively (`cpu_has_native_bf16()`); it picks the CPU dtype.
    """
    _check(config, platform)
    if platform != "cpu":
        return replace(config, dtype=config.dtype or "auto")
    fill = {"distributed_executor_backend": "uni", "enforce_eager": True, "block_size": CPU_BLOCK_SIZE,
            "kv_cache_memory_bytes": CPU_KV_CACHE_BYTES, "async_scheduling": False,
            "dtype": "bfloat16" if cpu_bf16 else "float32"}
    return replace(config, **{k: v for k, v in fill.items() if getattr(config, k) is None})


def _check(config: EngineConfig, platform: str) -> None:
    clash = sorted(OWNED_ARGS & set(config.extra_engine_args))
    if clash:
        raise EngineConfigError(f"extra_engine_args may not set {clash}: use the EngineConfig fields")
    if config.kv_cache_memory_bytes is not None and config.gpu_memory_utilization is not None:
        raise EngineConfigError("set kv_cache_memory_bytes or gpu_memory_utilization, not both")
    if config.distributed_executor_backend == "uni" and config.num_devices > 1:
        raise EngineConfigError(f"the 'uni' executor runs one worker; tensor x pipeline parallel = "
                                f"{config.num_devices} needs 'mp' or 'ray'")
    if platform == "cpu":
        if config.gpu_memory_utilization is not None:
            raise EngineConfigError("gpu_memory_utilization applies to GPUs; on CPU set kv_cache_memory_bytes")
        if config.kv_offload_gib is not None:
            raise EngineConfigError("KV offloading (swap) is CUDA-only in vLLM 0.32: on CPU preemption "
                                    "recomputes; leave kv_offload_gib unset")
    if config.cost_model_path is not None and config.kv_offload_gib is None:
        raise EngineConfigError("cost_model_path chooses between loading offloaded KV and recomputing: "
                                "it needs kv_offload_gib")


def resolve_engine_args(config: EngineConfig, platform: str, model_path: str, scheduler_config: dict,
                        cpu_bf16: bool = False) -> dict:
    """Keyword arguments of vLLM's `AsyncEngineArgs` for `config` on `platform`."""
    config = with_platform_defaults(config, platform, cpu_bf16)
    args = dict(
        model=model_path, tokenizer=model_path, served_model_name=[config.served_name],
        max_model_len=config.max_model_len, max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        enable_prefix_caching=config.enable_prefix_caching, seed=config.seed, dtype=config.dtype,
        tensor_parallel_size=config.tensor_parallel_size,
        pipeline_parallel_size=config.pipeline_parallel_size,
        disable_log_stats=False, additional_config=dict(scheduler_config),
    )
    optional = {"block_size": config.block_size, "kv_cache_memory_bytes": config.kv_cache_memory_bytes,
                "gpu_memory_utilization": config.gpu_memory_utilization,
                "distributed_executor_backend": config.distributed_executor_backend,
                "enforce_eager": config.enforce_eager, "async_scheduling": config.async_scheduling}
    args.update({k: v for k, v in optional.items() if v is not None})
    if config.kv_offload_gib is not None:
        args.update(kv_offloading_size=config.kv_offload_gib, kv_offloading_backend="native")
    args.update(config.extra_engine_args)
    return args


def effective_dtype(config: EngineConfig) -> str:
    """The dtype an engine built from `config` on this machine runs in (for benchmark records)."""
    return with_platform_defaults(config, resolve_platform(config, detect_platform()), cpu_has_native_bf16()).dtype


def prepare_process(platform: str) -> None:
    """Process environment the platform needs before vLLM starts."""
    if platform != "cpu":
        return
    # Measured here: without one OpenMP thread per process, decode collapses on a 2-core machine.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    if not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)  # an empty value crashes vLLM


def engine_kwargs(config: EngineConfig) -> dict:
    """`AsyncEngineArgs` keywords for `config` on this machine (also what `vllm serve` would be given)."""
    from engine.models import resolve_model
    from engine.vllm_scheduler import scheduler_additional_config

    platform = resolve_platform(config, detect_platform())
    prepare_process(platform)
    return resolve_engine_args(config, platform, resolve_model(config.model), scheduler_additional_config(config),
                               cpu_has_native_bf16())


def build_vllm_config(config: EngineConfig):
    """vLLM's `VllmConfig` for `config` on this machine (prepares offline models on first use).

    The scheduler plug-in is chosen after vLLM has resolved async scheduling (on by default on
    GPUs), so the class always matches the mode the engine core runs in.
    """
    from vllm.engine.arg_utils import AsyncEngineArgs

    from engine.vllm_scheduler import scheduler_class
    from engine.vllm_seams import check_vllm

    check_vllm()  # fail here, naming the seam, rather than inside vLLM's engine core process
    vllm_config = AsyncEngineArgs(**engine_kwargs(config)).create_engine_config()
    scheduler = vllm_config.scheduler_config
    scheduler.scheduler_cls = scheduler_class(bool(scheduler.async_scheduling))
    if config.cost_model_path is not None:
        from engine.kv_offload import use_cost_aware_offload

        use_cost_aware_offload(vllm_config, config.cost_model_path)
    return vllm_config
