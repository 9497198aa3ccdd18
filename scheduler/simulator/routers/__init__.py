"""Cluster router registry: one file per router, a dict of names, a factory that lists valid names."""

from scheduler.simulator.routers.affinity import AffinityRouter
from scheduler.simulator.routers.base import Router, SessionAsk
from scheduler.simulator.routers.central import CentralRouter
from scheduler.simulator.routers.least_active import LeastActiveRouter
from scheduler.simulator.routers.pow2 import Pow2Router
from scheduler.simulator.routers.round_robin import RoundRobinRouter

ROUTERS: dict[str, type] = {
    cls.name: cls
    for cls in (CentralRouter, Pow2Router, RoundRobinRouter, AffinityRouter, LeastActiveRouter)
}


class UnknownRouterError(ValueError):
    def __init__(self, name: str):
        self.name = name
        self.valid = sorted(ROUTERS)
        super().__init__(f"unknown cluster router {name!r}; valid: {', '.join(self.valid)}")


def make_router(name: str, **settings) -> Router:
    """A fresh router; `settings` it does not use are ignored (one settings dict serves all)."""
    try:
        cls = ROUTERS[name]
    except KeyError:
        raise UnknownRouterError(name) from None
    return cls(**settings)


__all__ = ["ROUTERS", "Router", "SessionAsk", "UnknownRouterError", "make_router"]
