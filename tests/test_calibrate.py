"""`stream2llm calibrate` on the real engine (tiny model, a few small sizes): the JSON it writes loads
as a cost model, its recompute curve rises with the tokens, and swap is unavailable on CPU."""

import json

import pytest

from engine.calibration import CalibrationError, calibrate
from engine.config import EngineConfig
from scheduler.cost_model import CostModelError, load_cost_model
from stream2llm.cli import main


def test_calibrate_writes_a_monotone_cpu_cost_model(tmp_path):
    output = tmp_path / "cost.json"
    code = main(["calibrate", "--model", "tiny", "--sizes", "32,128,384", "--repeats", "2",
                 "--decode-batches", "1,4", "--max-model-len", "512",
                 "--kv-cache-bytes", str(4 << 20), "--output", str(output)])
    assert code == 0
    raw = json.loads(output.read_text())
    assert raw["swap_out"] is None and raw["swap_in"] is None  # never faked on CPU
    assert [x for x, _ in raw["recompute"]] == [32, 128, 384]
    model = load_cost_model(output)
    assert not model.swap_available
    with pytest.raises(CostModelError):
        model.swap_out_s(4)
    grid = [model.recompute_s(n) for n in range(0, 1025, 16)]
    assert all(b >= a for a, b in zip(grid, grid[1:]))
    assert model.recompute_s(32) > 0
    # The tiny model's prefill is dominated by fixed per-step overhead, so on a noisy machine the fit
    # may be flat; it must never fall (the fit is forced monotone).
    assert model.recompute_s(2048) >= model.recompute_s(32)
    assert model.decode_step is not None and model.decode_step(4) > 0
    # a streamed turn's attention to cached context and a long decode's reads are measured, not assumed
    anchor, *measured = raw["prefill_context"]  # curves of extras start at no context, no extra
    assert anchor == [0, 0] and measured and all(pairs > 0 and extra >= 0 for pairs, extra in measured)
    assert raw["decode_context"] and raw["decode_base_context"] > 0


async def test_sizes_that_do_not_fit_are_rejected_before_starting_an_engine():
    with pytest.raises(CalibrationError, match="max_model_len"):
        await calibrate(EngineConfig(model="tiny", max_model_len=256), [128, 512], 1, ())
