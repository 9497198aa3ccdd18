"""Measured cost model (fit, JSON round trip, no fake swap) and the parametric GPU model."""

import json

import pytest

from scheduler.cost_model import (
    CostModelError,
    Curve,
    MeasuredCostModel,
    build_cost_model,
    load_cost_model,
    save_cost_model,
)
from scheduler.gpu_model import H200, LLAMA31_8B, ParametricCostModel


def test_curve_interpolates_averages_and_extrapolates_linearly():
    curve = Curve([(100, 0.1), (100, 0.3), (200, 0.4), (400, 0.8)])
    assert curve(100) == pytest.approx(0.2)
    assert curve(150) == pytest.approx(0.3)
    assert curve(800) > curve(400) > curve(200)
    assert curve(0) >= 0.0
    with pytest.raises(CostModelError):
        Curve([])
    with pytest.raises(CostModelError):
        Curve([(10, -1.0)])


def test_cpu_model_without_swap_says_so(tmp_path):
    data = build_cost_model([(128, 0.02), (512, 0.07), (2048, 0.35)], block_size=16,
                            device="cpu", model="smollm2-135m")
    assert data["swap_out"] is None and data["swap_in"] is None
    path = tmp_path / "cost.json"
    save_cost_model(data, path)
    model = load_cost_model(path)
    assert not model.swap_available
    assert model.recompute_s(512) == pytest.approx(0.07)
    with pytest.raises(CostModelError, match="swap is not available"):
        model.swap_out_s(4)
    assert model.step_s(512, 0, 0, 0) == pytest.approx(0.07)


def test_round_trip_with_swap_and_decode(tmp_path):
    data = build_cost_model([(100, 0.01), (1000, 0.1)], block_size=16, device="gpu", model="m",
                            decode_step=[(1, 0.005), (64, 0.008)], swap_out=[(10, 0.001)],
                            swap_in=[(10, 0.002)], notes="test")
    path = tmp_path / "c.json"
    save_cost_model(data, path)
    model = load_cost_model(path)
    assert model.swap_available and model.swap_in_s(10) == pytest.approx(0.002)
    assert model.step_s(0, 0, 64, 0) == pytest.approx(0.008)
    assert model.to_json() == json.loads(path.read_text())


def test_context_curves_price_what_a_fresh_prompt_curve_cannot(tmp_path):
    data = build_cost_model([(128, 0.06), (512, 0.18)], block_size=32, device="cpu", model="m",
                            decode_step=[(1, 0.03), (8, 0.04)],
                            prefill_context=[(65536, 0.03), (131072, 0.05)],
                            decode_context=[(1000, 0.005)], decode_base_context=22)
    path = tmp_path / "c.json"
    save_cost_model(data, path)
    model = load_cost_model(path)
    assert model.to_json() == json.loads(path.read_text())
    # 128 new tokens after 512 cached: the fresh curve's 0.06 plus the cached-context extra
    assert model.step_s(128, 128 * (512 + 64), 0, 0, cached_pairs=128 * 512) == pytest.approx(0.09)
    assert model.step_s(128, 128 * 64, 0, 0) == pytest.approx(0.06)
    assert model.step_s(0, 0, 1, 22) == pytest.approx(0.03)  # at the decode curve's own context
    assert model.step_s(0, 0, 2, 2 * 22 + 1000) == pytest.approx(0.03 + 1 / 7 * 0.01 + 0.005)
    old = {key: value for key, value in data.items() if "context" not in key}
    assert MeasuredCostModel.from_json(old).step_s(128, 0, 0, 0, cached_pairs=65536) == pytest.approx(0.06)


def test_bad_files_are_rejected(tmp_path):
    path = tmp_path / "x.json"
    path.write_text("{not json")
    with pytest.raises(CostModelError):
        load_cost_model(path)
    path.write_text(json.dumps({"format": "other"}))
    with pytest.raises(CostModelError, match="not a stream2llm-cost-model"):
        load_cost_model(path)
    with pytest.raises(CostModelError, match="both"):
        build_cost_model([(1, 1.0)], block_size=16, device="d", model="m", swap_out=[(1, 1.0)])


def test_parametric_h200_model_is_physically_sensible():
    model = ParametricCostModel(H200, LLAMA31_8B)
    assert LLAMA31_8B.kv_bytes_per_token == 131072
    assert 700_000 < model.kv_capacity_tokens() < 900_000  # ~107 GB of KV
    prefill_8k = model.recompute_s(8192)
    assert 0.1 < prefill_8k < 0.4  # compute-bound, ~70% of 989 TFLOP/s
    assert model.recompute_s(16384) > 2 * prefill_8k - model.gpu.step_overhead_s  # attention
    decode = model.step_s(0, 0, 64, 64 * 4000)
    assert 0.004 < decode < 0.02  # memory-bound: weights + KV over HBM
    blocks = 8192 // 16
    assert model.swap_out_s(blocks) + model.swap_in_s(blocks) < prefill_8k
