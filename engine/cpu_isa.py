"""Keeps vLLM's CPU attention off its AMX kernels (a vLLM general plug-in: the entry point
`vllm.general_plugins` in pyproject.toml makes vLLM call `keep_cpu_attention_off_amx` in each of
its processes, front end, engine core and workers, whichever way they were started).

vLLM picks its AMX attention kernels for bfloat16 whenever torch reports AMX tiles. On a 2-core
Intel Xeon VM of this project's machine pool (AMX advertised) a worker running them died with
SIGILL (exit code -4) at its first step in 3 of 4 starts of the tiny model, and the pipeline tests
failed with EngineDeadError; with this plug-in, 3 of 3 of the same starts answered. vLLM's choice
without AMX under the same block-size rule is its AVX-512 "vec" kernels. Set
STREAM2LLM_CPU_AMX_ATTENTION=1 to keep AMX on a host known to run it.
"""

from __future__ import annotations

import os

AMX_ATTENTION_ENV = "STREAM2LLM_CPU_AMX_ATTENTION"


def keep_cpu_attention_off_amx() -> None:
    if os.environ.get(AMX_ATTENTION_ENV) == "1":
        return
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.v1.attention.backends import cpu_attn

    choose = cpu_attn._get_attn_isa
    if getattr(choose, "keeps_off_amx", False):
        return

    def without_amx(*args, **kwargs) -> str:
        isa = choose(*args, **kwargs)
        return "vec" if isa == "amx" else isa  # both need a block size that is a multiple of 32

    without_amx.keeps_off_amx = True
    cpu_attn._get_attn_isa = without_amx
