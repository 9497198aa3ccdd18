"""Session affinity alone: a session's replica is a stable hash of its id (what a sticky-session
load balancer does), with no look at load."""

from __future__ import annotations

import zlib

from scheduler.simulator.routers.base import SessionAsk, Stateless


class AffinityRouter(Stateless):
    name = "affinity"

    def __init__(self, **_settings):
        pass

    def place(self, ask: SessionAsk, now: float) -> int:
        return zlib.crc32(ask.session_id.encode()) % len(self.replicas)
