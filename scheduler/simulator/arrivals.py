"""Session arrival processes: one file of generators, a dict of names, a factory listing them.

Poisson: exponential gaps. Bursty: a gamma renewal process with the same mean rate and a
coefficient of variation of `BURSTY_CV` (3): most gaps are tiny and a few are long, so sessions
come in bursts well above the mean rate.
"""

from __future__ import annotations

import numpy as np

from stream2llm.data.traces import poisson_arrivals

BURSTY_CV = 3.0


def bursty_arrivals(n: int, qps: float, seed: int) -> list[float]:
    if n < 0 or qps <= 0:
        raise ValueError(f"need n >= 0 and qps > 0, got n={n}, qps={qps}")
    shape = 1.0 / BURSTY_CV ** 2
    gaps = np.random.default_rng(seed).gamma(shape, 1.0 / (qps * shape), size=n)
    if n:
        gaps[0] = 0.0
    return [float(t) for t in np.cumsum(gaps)]


ARRIVALS = {"poisson": poisson_arrivals, "bursty": bursty_arrivals}


def make_arrivals(name: str, n: int, qps: float, seed: int) -> list[float]:
    try:
        process = ARRIVALS[name]
    except KeyError:
        raise ValueError(f"unknown arrival process {name!r}; valid: {', '.join(sorted(ARRIVALS))}") from None
    return process(n, qps, seed)
