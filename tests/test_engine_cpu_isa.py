"""The vLLM plug-in that keeps CPU attention off AMX (`engine.cpu_isa`): registered where vLLM
looks for it, and vLLM's ISA choice no longer answers "amx" on a host that reports AMX tiles."""

from importlib.metadata import entry_points

import torch

from engine.cpu_isa import keep_cpu_attention_off_amx


def test_the_plugin_is_registered_for_every_vllm_process():
    names = {e.value for e in entry_points(group="vllm.general_plugins")}
    assert "engine.cpu_isa:keep_cpu_attention_off_amx" in names


def test_cpu_attention_takes_the_avx512_kernels_where_it_would_take_amx(monkeypatch):
    from vllm.v1.attention.backends import cpu_attn

    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)  # as on an AMX host
    keep_cpu_attention_off_amx()
    keep_cpu_attention_off_amx()  # loaded more than once in a process: wraps once
    assert cpu_attn._get_attn_isa(torch.bfloat16, 32, 64) == "vec"
    assert cpu_attn._get_attn_isa(torch.bfloat16, 16, 64) == "vec16"  # unchanged where AMX was not chosen
