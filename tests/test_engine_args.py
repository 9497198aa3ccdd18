"""Engine configuration reaches vLLM unchanged, with per-platform defaults and clear errors.

The pure resolution is checked for both platforms on this CPU machine; one test builds vLLM's own
config for the tiny model to prove the arguments are ones vLLM 0.32 accepts.
"""

import os

import pytest

from engine.config import EngineConfig, EngineConfigError
from engine.engine_args import (CPU_BLOCK_SIZE, CPU_KV_CACHE_BYTES, cpu_has_native_bf16, resolve_engine_args,
                                resolve_platform, with_platform_defaults)

POLICY = {"stream2llm_policy": "fcfs"}


def _args(platform: str, **fields) -> dict:
    return resolve_engine_args(EngineConfig(**fields), platform, "/models/x", POLICY)


def test_cpu_keeps_the_safe_settings():
    args = _args("cpu")
    assert args["distributed_executor_backend"] == "uni" and args["enforce_eager"] is True
    assert args["block_size"] == CPU_BLOCK_SIZE and args["kv_cache_memory_bytes"] == CPU_KV_CACHE_BYTES
    assert args["async_scheduling"] is False and "gpu_memory_utilization" not in args
    assert args["additional_config"] == POLICY


def test_cpu_dtype_follows_native_bfloat16(tmp_path):
    assert _args("cpu")["dtype"] == "float32"  # emulated bfloat16 is several times slower
    assert resolve_engine_args(EngineConfig(), "cpu", "/m", POLICY, cpu_bf16=True)["dtype"] == "bfloat16"
    assert _args("cpu", dtype="bfloat16")["dtype"] == "bfloat16"  # an explicit choice is kept
    assert _args("cuda")["dtype"] == "auto"
    avx2, amx = tmp_path / "avx2", tmp_path / "amx"
    avx2.write_text("model name\t: AMD EPYC\nflags\t\t: fpu sse avx2 fma\n")
    amx.write_text("flags\t\t: fpu avx2 avx512f avx512_bf16 amx_tile amx_bf16\n")
    assert (cpu_has_native_bf16(str(avx2)), cpu_has_native_bf16(str(amx))) == (False, True)
    assert cpu_has_native_bf16(str(tmp_path / "absent")) is False


def test_gpu_leaves_vllm_its_defaults():
    args = _args("cuda")
    for key in ("distributed_executor_backend", "enforce_eager", "block_size", "kv_cache_memory_bytes",
                "gpu_memory_utilization", "async_scheduling", "kv_offloading_size"):
        assert key not in args, key  # CUDA graphs, memory fraction, executor and async: vLLM's own


def test_explicit_settings_reach_vllm_unchanged_on_either_platform():
    gpu = _args("cuda", tensor_parallel_size=4, pipeline_parallel_size=2, distributed_executor_backend="ray",
                enforce_eager=True, gpu_memory_utilization=0.8, dtype="float16", block_size=16,
                kv_offload_gib=8.0, extra_engine_args={"max_logprobs": 5})
    assert (gpu["tensor_parallel_size"], gpu["pipeline_parallel_size"]) == (4, 2)
    assert gpu["distributed_executor_backend"] == "ray" and gpu["enforce_eager"] is True
    assert (gpu["gpu_memory_utilization"], gpu["dtype"], gpu["block_size"]) == (0.8, "float16", 16)
    assert (gpu["kv_offloading_size"], gpu["kv_offloading_backend"]) == (8.0, "native")
    assert gpu["max_logprobs"] == 5
    cpu = _args("cpu", block_size=64, kv_cache_memory_bytes=123 << 20, enforce_eager=False)
    assert (cpu["block_size"], cpu["kv_cache_memory_bytes"], cpu["enforce_eager"]) == (64, 123 << 20, False)


@pytest.mark.parametrize("platform, fields, words", [
    ("cpu", {"gpu_memory_utilization": 0.5}, "gpu_memory_utilization"),
    ("cpu", {"kv_offload_gib": 4.0}, "CUDA-only"),
    ("cuda", {"kv_cache_memory_bytes": 1 << 30, "gpu_memory_utilization": 0.5}, "not both"),
    ("cuda", {"tensor_parallel_size": 2, "distributed_executor_backend": "uni"}, "'uni' executor"),
    ("cuda", {"extra_engine_args": {"enforce_eager": False}}, "EngineConfig fields"),
    ("cpu", {"extra_engine_args": {"distributed_executor_backend": "mp"}}, "EngineConfig fields"),
])
def test_contradictions_are_clear_errors(platform, fields, words):
    with pytest.raises(EngineConfigError, match=words):
        with_platform_defaults(EngineConfig(**fields), platform)


@pytest.mark.parametrize("fields", [{"tensor_parallel_size": 0}, {"platform": "tpu"},
                                    {"gpu_memory_utilization": 0.0}, {"block_size": -16},
                                    {"answer_budget_tokens": 9000}])
def test_out_of_range_fields_fail_at_construction(fields):
    with pytest.raises(EngineConfigError):
        EngineConfig(**fields)


def test_an_explicit_cuda_platform_on_a_cpu_machine_says_so():
    with pytest.raises(EngineConfigError, match="no CUDA GPU"):
        resolve_platform(EngineConfig(platform="cuda"), detected="cpu")
    assert resolve_platform(EngineConfig(), detected="cpu") == "cpu"
    assert resolve_platform(EngineConfig(), detected="cuda") == "cuda"


def test_vllm_accepts_the_arguments_and_the_plugin_matches_the_scheduling_mode():
    from engine.engine_args import build_vllm_config
    from engine.vllm_scheduler import POLICY_KEY, StreamingScheduler

    vllm_config = build_vllm_config(EngineConfig(model="tiny", max_model_len=512, policy="lcas",
                                                 kv_cache_memory_bytes=16 << 20))
    # vLLM's CPU platform turns "uni" into "mp" unless V1 multiprocessing is off; one worker either way
    multiprocessing = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") == "1"
    assert vllm_config.parallel_config.distributed_executor_backend == ("mp" if multiprocessing else "uni")
    assert vllm_config.parallel_config.world_size == 1
    assert vllm_config.model_config.enforce_eager and vllm_config.cache_config.block_size == CPU_BLOCK_SIZE
    assert vllm_config.cache_config.kv_cache_memory_bytes == 16 << 20
    assert vllm_config.additional_config[POLICY_KEY] == "lcas"
    assert not vllm_config.scheduler_config.async_scheduling
    assert vllm_config.scheduler_config.get_scheduler_cls() is StreamingScheduler
