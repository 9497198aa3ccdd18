"""The dtype benchmark's verdict can fail: it compares the engine's default with the fastest dtype."""

import pytest

from bench.cpu_dtype import summarize


def test_default_slower_than_the_fastest_fails_the_verdict():
    times = {"bfloat16": [40.0, 44.0, 42.0], "float32": [9.0, 8.0, 10.0]}
    good = summarize(times, 1800, "float32", 0.1)
    assert good["default_is_fastest"] and good["fastest_dtype"] == "float32"
    assert good["float32_speedup"] == pytest.approx(42.0 / 9.0)
    assert good["dtypes"]["float32"]["prefill_tokens_per_s"] == pytest.approx(200.0)
    bad = summarize(times, 1800, "bfloat16", 0.1)
    assert not bad["default_is_fastest"] and bad["default_vs_fastest"] == pytest.approx(42.0 / 9.0)


def test_a_default_within_tolerance_passes():
    times = {"bfloat16": [10.5], "float32": [10.0]}
    assert summarize(times, 1000, "bfloat16", 0.1)["default_is_fastest"]
    assert not summarize(times, 1000, "bfloat16", 0.01)["default_is_fastest"]
