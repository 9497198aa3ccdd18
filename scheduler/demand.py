"""Expected KV demand per source type, learned from finished sessions, and the replica count it implies."""

from __future__ import annotations

import math

MAX_SOURCE_TYPES = 64  # learned types at most: an unbounded set of client-chosen names is not learned


class DemandModel:
    """Expected context tokens per session, by source type (exponential moving average)."""

    def __init__(self, priors: dict[str, int], default_tokens: int = 1024, alpha: float = 0.2):
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self._tokens = {k: float(v) for k, v in priors.items()}
        self._default = float(default_tokens)
        self._alpha = alpha
        self.observations: dict[str, int] = {}

    def expected_tokens(self, source_type: str) -> int:
        return int(math.ceil(self._tokens.get(source_type, self._default)))

    def observe(self, source_type: str, tokens: int) -> None:
        old = self._tokens.get(source_type)
        if old is None and len(self._tokens) >= MAX_SOURCE_TYPES:
            return
        # The first real observation replaces a prior wholesale only when there is no prior.
        self._tokens[source_type] = float(tokens) if old is None else old + self._alpha * (tokens - old)
        self.observations[source_type] = self.observations.get(source_type, 0) + 1

    def set_priors(self, priors: dict[str, int]) -> None:
        """New priors (a redeploy): they replace the estimate of every type not yet observed."""
        for source_type, tokens in priors.items():
            if source_type not in self.observations:
                self._tokens[source_type] = float(tokens)


def desired_replicas(current: int, pressure_frac: float, queued: int, target_frac: float,
                     sessions_per_replica: float, min_replicas: int, max_replicas: int) -> int:
    """Replicas needed to bring projected KV use to `target_frac`, plus room for the queue."""
    if not 0.0 < target_frac <= 1.0:
        raise ValueError(f"target_frac must be in (0, 1], got {target_frac}")
    if current <= 0:
        want = 1 if queued else min_replicas
    else:
        want = math.ceil(current * pressure_frac / target_frac) if pressure_frac > 0 else min_replicas
        if queued:
            want = max(want, current + math.ceil(queued / max(sessions_per_replica, 1.0)))
    return max(min_replicas, min(max_replicas, want))
