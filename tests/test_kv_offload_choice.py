"""The recompute-vs-swap choice at resume time, and the wiring of the cost-aware offload connector.

The connector itself needs CUDA (tests/test_gpu.py); the choice is pure and the wiring is checked on
vLLM's own transfer config here.
"""

from types import SimpleNamespace

import pytest

from engine.config import EngineConfig, EngineConfigError
from engine.engine_args import with_platform_defaults
from scheduler.cost_model import MeasuredCostModel, Curve
from scheduler.preemption import RECOMPUTE, SWAP, choose_resume_kind


def _cost(swap_in_s_per_block: float | None) -> MeasuredCostModel:
    recompute = Curve([(0, 0.05), (8000, 0.85)])  # 50 ms fixed, then 0.1 ms a token
    if swap_in_s_per_block is None:
        return MeasuredCostModel(recompute, block_size=16)
    swap = Curve([(0, 0.0), (500, 500 * swap_in_s_per_block)])
    return MeasuredCostModel(recompute, swap_out=swap, swap_in=swap, block_size=16)


def test_a_large_victim_loads_when_the_link_is_faster_than_its_prefill():
    assert choose_resume_kind(4000, 16, _cost(1e-4)) == SWAP  # 250 blocks: 25 ms vs 0.45 s


def test_a_victim_recomputes_when_loading_its_blocks_costs_more():
    assert choose_resume_kind(4000, 16, _cost(1e-2)) == RECOMPUTE  # 2.5 s vs 0.45 s


def test_the_choice_is_priced_on_the_victims_own_size():
    cost = _cost(3e-3)  # 3 ms a block (16 tokens) vs 1.6 ms of prefill for 16 tokens after a 50 ms start
    assert choose_resume_kind(160, 16, cost) == SWAP  # 30 ms vs 66 ms
    assert choose_resume_kind(6000, 16, cost) == RECOMPUTE  # 1.125 s vs 0.65 s


def test_without_swap_measurements_the_connector_keeps_its_default_load():
    assert choose_resume_kind(4000, 16, _cost(None)) == SWAP
    assert choose_resume_kind(4000, 16, None) == SWAP


def test_cost_model_without_offload_is_refused():
    with pytest.raises(EngineConfigError, match="kv_offload_gib"):
        with_platform_defaults(EngineConfig(cost_model_path="/tmp/cost.json"), "cuda")


def test_wiring_points_vllms_offload_config_at_the_cost_aware_connector(tmp_path):
    from vllm.config import KVTransferConfig

    from engine.kv_offload import COST_MODEL_KEY, CONNECTOR_NAME, use_cost_aware_offload

    transfer = KVTransferConfig(kv_connector="OffloadingConnector", kv_role="kv_both",
                                kv_connector_extra_config={"cpu_bytes_to_use": 1 << 30})
    use_cost_aware_offload(SimpleNamespace(kv_transfer_config=transfer), tmp_path / "cost.json")
    assert transfer.kv_connector == CONNECTOR_NAME and transfer.kv_connector_module_path == "engine.kv_offload"
    assert transfer.kv_connector_extra_config == {"cpu_bytes_to_use": 1 << 30,
                                                  COST_MODEL_KEY: str(tmp_path / "cost.json")}
    with pytest.raises(EngineConfigError):
        use_cost_aware_offload(SimpleNamespace(kv_transfer_config=None), tmp_path / "cost.json")
