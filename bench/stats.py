"""The one percentile every benchmark reports.

`percentile(values, q)` is the linear interpolation between closest ranks (numpy's default
`np.percentile(..., method="linear")`, Hyndman and Fan's type 7, what `vllm bench serve` reports):
with the n values sorted, the p-th percentile sits at rank h = (n - 1) * q / 100 and is
`v[floor(h)] + (h - floor(h)) * (v[floor(h) + 1] - v[floor(h)])`. So P50 is the median, P0 the
minimum, P100 the maximum, and the P99 of 16 values lies 85% of the way from the 15th to the 16th.
The simulator (`scheduler.simulator.replay`, which may not import `bench`) computes the same thing
with `np.percentile`. Locust's own percentiles (`bench.soak`) are its response-time buckets' and
are reported as locust gives them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

DEFINITION = "linear interpolation between closest ranks (numpy's default, type 7)"


def percentile(values: Iterable[float | None], q: float) -> float | None:
    """The `q`-th percentile (0 <= q <= 100) of the values that are not None; None when none are."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    ordered = sorted(float(v) for v in values if v is not None)
    if not ordered:
        return None
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (rank - low) * (ordered[high] - ordered[low])
