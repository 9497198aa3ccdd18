"""Least active: the replica with the fewest open sessions, read live (an oracle no real router
has; the simulator's multi-engine routing before routers were pluggable)."""

from __future__ import annotations

from scheduler.simulator.routers.base import SessionAsk, Stateless


class LeastActiveRouter(Stateless):
    name = "least_active"

    def __init__(self, **_settings):
        pass

    def place(self, ask: SessionAsk, now: float) -> int:
        return min(range(len(self.replicas)), key=lambda e: self.replicas[e].num_active)
