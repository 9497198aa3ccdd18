"""Round-robin: each new session goes to the next replica in turn, whatever they hold."""

from __future__ import annotations

from scheduler.simulator.routers.base import SessionAsk, Stateless


class RoundRobinRouter(Stateless):
    name = "round_robin"

    def __init__(self, **_settings):
        self._next = 0

    def place(self, ask: SessionAsk, now: float) -> int:
        chosen = self._next % len(self.replicas)
        self._next += 1
        return chosen
