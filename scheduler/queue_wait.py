"""When queued work can start: the rate sessions left the admission queue for a replica lately.

While sessions wait, every admission comes out of the queue (nobody passes it), so the recent
rate of those is the rate at which room frees up for them: a session joining at position `n`
should start in about `n / rate` seconds. The admission controller uses it to decide a full queue
(join it anyway when the estimate is within the caller's deadline, else 429 at once) and for the
Retry-After it sends. With fewer than `min_events` in the window there is no estimate. Cost:
amortised O(1) per event and query (a deque trimmed from the left).
"""

from __future__ import annotations

import math
from collections import deque


class QueueWait:
    """Sessions drained from the admission queue over the last `window_s` seconds."""

    def __init__(self, window_s: float = 30.0, min_events: int = 3):
        if window_s <= 0 or min_events < 1:
            raise ValueError("window_s must be > 0 and min_events >= 1")
        self.window_s = window_s
        self.min_events = min_events
        self._drained: deque[float] = deque()

    def note(self, now: float) -> None:
        """A queued session was placed at `now`."""
        self._drained.append(now)
        self._trim(now)

    def _trim(self, now: float) -> None:
        while self._drained and now - self._drained[0] > self.window_s:
            self._drained.popleft()

    def per_s(self, now: float) -> float | None:
        """Sessions placed out of the queue per second lately; None without enough of them."""
        self._trim(now)
        if len(self._drained) < self.min_events:
            return None
        span = max(now - self._drained[0], 1.0)  # since the first in the window, not the window: a queue that formed lately
        return len(self._drained) / span

    def wait_s(self, position: int, now: float) -> float | None:
        """Estimated seconds until the session at `position` (1: the head) starts; None: no estimate."""
        rate = self.per_s(now)
        return None if rate is None else position / rate

    def retry_after_s(self, position: int, now: float, fallback_s: float) -> int:
        """Whole seconds to wait before asking again, at least 1: the estimate, else `fallback_s`."""
        wait = self.wait_s(position, now)
        return max(1, math.ceil(fallback_s if wait is None else wait))
