"""The one percentile of the benchmarks (`bench.stats.percentile`): its definition, and that no
benchmark computes a percentile another way."""

import re
from pathlib import Path

import numpy as np
import pytest

from bench.stats import percentile

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.mark.parametrize("values", [[3.0], [5.0, 1.0], [4.0, 1.0, 3.0, 2.0], list(np.linspace(0.1, 9.7, 16)),
                                    [0.2, 7.0, 7.0, 1.5, 30.0, 0.9, 2.2, 2.1]])
@pytest.mark.parametrize("q", [0, 25, 50, 95, 99, 100])
def test_equals_numpy_linear_interpolation(values, q):
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q, method="linear")))


def test_small_samples_interpolate_between_closest_ranks():
    sixteen = [float(i) for i in range(1, 17)]
    assert percentile(sixteen, 99) == pytest.approx(15.85)  # not the maximum, not the 15th value
    assert percentile([1.0, 2.0, 3.0, 10.0], 50) == 2.5  # the median


def test_missing_values_are_skipped_and_nothing_is_none():
    assert percentile([None, 1.0, 3.0], 50) == 2.0
    assert percentile([None], 99) is None
    assert percentile([], 50) is None


def test_q_outside_0_100_is_an_error():
    with pytest.raises(ValueError, match=r"\[0, 100\]"):
        percentile([1.0], 101)


def test_no_benchmark_defines_or_calls_another_percentile():
    other = re.compile(r"def (percentile|_pct)\b|np\.(percentile|quantile)\(|statistics\.quantiles\(|"
                       r"sorted\([^)]*\)\[(int|round)\(")
    found = [f"{p.name}: {m.group(0)}" for p in BENCH.glob("*.py") if p.name != "stats.py"
             for m in other.finditer(p.read_text(encoding="utf-8"))]
    assert found == []
