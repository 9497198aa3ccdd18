"""Projected KV demand per source type, learned online from finished sessions, and the replica
count it implies.

A session's projected size is a high percentile (`percentile`, default P90) of the context sizes
its source type's sessions reached when they finished, over the last `window` of them; a session
already larger than some of those is projected from the ones larger than it (the percentile of the
tail above its current size), so a long session is not projected to stop growing at the median.
Until a type has `min_observations` finished sessions its configured prior stands in for the
percentile. Cost: O(log window) per projection, O(window) per observation (a sorted list).
"""

from __future__ import annotations

import bisect
import math
from collections import deque

MAX_SOURCE_TYPES = 64  # learned types at most: an unbounded set of client-chosen names is not learned


class _Sizes:
    """The last `window` observed sizes of one source type, in arrival order and sorted."""

    def __init__(self, window: int):
        self.recent: deque[int] = deque()
        self.ordered: list[int] = []
        self.window = window

    def add(self, tokens: int) -> None:
        if len(self.recent) >= self.window:
            old = self.recent.popleft()
            del self.ordered[bisect.bisect_left(self.ordered, old)]
        self.recent.append(tokens)
        bisect.insort(self.ordered, tokens)

    def percentile_above(self, q: float, current: int) -> int | None:
        """The `q` percentile of the sizes above `current`; None when none is above it."""
        lo = bisect.bisect_right(self.ordered, current)
        n = len(self.ordered) - lo
        if n == 0:
            return None
        return self.ordered[lo + min(n, math.ceil(q * n)) - 1]  # nearest rank


class DemandModel:
    """Projected context tokens per session, by source type (see the module docstring)."""

    def __init__(self, priors: dict[str, int], default_tokens: int = 1024, percentile: float = 0.9,
                 window: int = 256, min_observations: int = 3):
        if not 0.0 < percentile <= 1.0:
            raise ValueError(f"percentile must be in (0, 1], got {percentile}")
        if window < 1 or min_observations < 1:
            raise ValueError("window and min_observations must be >= 1")
        self._priors = {k: int(v) for k, v in priors.items()}
        self._default = int(default_tokens)
        self.percentile = percentile
        self.min_observations = min_observations
        self._window = window
        self._sizes: dict[str, _Sizes] = {}
        self.observations: dict[str, int] = {}

    def expected_tokens(self, source_type: str, current: int = 0) -> int:
        """Projected final context tokens of a session of this type that holds `current` now."""
        sizes = self._sizes.get(source_type)
        if sizes is None or len(sizes.ordered) < self.min_observations:
            return max(current, self._priors.get(source_type, self._default))
        tail = sizes.percentile_above(self.percentile, current)
        return current if tail is None else tail

    def observe(self, source_type: str, tokens: int) -> None:
        """A session of this type finished holding `tokens` context tokens."""
        sizes = self._sizes.get(source_type)
        if sizes is None:
            if len(self._sizes) >= MAX_SOURCE_TYPES:
                return
            sizes = self._sizes[source_type] = _Sizes(self._window)
        sizes.add(int(tokens))
        self.observations[source_type] = self.observations.get(source_type, 0) + 1

    def set_priors(self, priors: dict[str, int]) -> None:
        """New priors (a redeploy): they stand for every type until it has enough observations."""
        self._priors.update({k: int(v) for k, v in priors.items()})

    def set_percentile(self, percentile: float) -> None:
        if not 0.0 < percentile <= 1.0:
            raise ValueError(f"percentile must be in (0, 1], got {percentile}")
        self.percentile = percentile


def desired_replicas(current: int, pressure_frac: float, queued: int, target_frac: float,
                     sessions_per_replica: float, min_replicas: int, max_replicas: int) -> int:
    """Replicas needed to bring the pressure (the admission budget's used share) to `target_frac`,
    plus room for the queue."""
    if not 0.0 < target_frac <= 1.0:
        raise ValueError(f"target_frac must be in (0, 1], got {target_frac}")
    if current <= 0:
        want = 1 if queued else min_replicas
    else:
        want = math.ceil(current * pressure_frac / target_frac) if pressure_frac > 0 else min_replicas
        if queued:
            want = max(want, current + math.ceil(queued / max(sessions_per_replica, 1.0)))
    return max(min_replicas, min(max_replicas, want))
