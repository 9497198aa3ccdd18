"""Wiring of the central memory-contention scheduler: a named, restartable Ray actor on the head node.

The logic lives in `scheduler.admission` (pure). This actor adds waiting: an admission that cannot
be placed at once waits (bounded queue) until a replica report or a released session makes room,
or until its timeout, then the caller answers 429. After a restart the actor starts empty and
rebuilds its view from the next round of replica reports (they list their open sessions).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from scheduler.admission import AdmissionController, DemandModel, ReplicaReport, UnknownSessionError

NAMESPACE = "stream2llm"


@ray.remote(max_restarts=-1, max_task_retries=3)
class CentralScheduler:
    def __init__(self, priors: dict, max_queue: int, stale_after_s: float, reserve_frac: float):
        self._ctl = AdmissionController(DemandModel(priors), max_queue, stale_after_s, reserve_frac)
        self._waiters: dict[str, asyncio.Future] = {}
        self._dead: set[str] = set()
        self.started_at = time.time()

    def ping(self) -> dict:
        return {"started_at": self.started_at, "node_id": ray.get_runtime_context().get_node_id()}

    def report(self, report: dict) -> dict:
        """A replica's periodic report; returns cluster pressure (replicas use it for autoscaling)."""
        self._dead.discard(report["replica_id"])
        self._ctl.report(ReplicaReport(**report), time.monotonic())
        self._wake()
        return self.pressure()

    async def admit(self, session_id: str, source_type: str, timeout_s: float,
                    exclude: list[str] | None = None) -> dict:
        """Place a session; waits in the bounded queue. Returns {"replica_id"} or {"rejected"}."""
        exclude_t = tuple(exclude or ()) + tuple(self._dead)
        replica_id = self._ctl.try_admit(session_id, source_type, time.monotonic(), exclude_t)
        if replica_id is not None:
            return {"replica_id": replica_id}
        if not self._ctl.enqueue(session_id, source_type, time.monotonic()):
            return self._rejection("admission queue full")
        future = self._waiters[session_id] = asyncio.get_running_loop().create_future()
        self._wake()
        try:
            return {"replica_id": await asyncio.wait_for(future, timeout_s)}
        except asyncio.TimeoutError:
            self._ctl.leave_queue(session_id)
            return self._rejection("no KV headroom within the admission timeout")
        finally:
            self._waiters.pop(session_id, None)

    def _rejection(self, reason: str) -> dict:
        return {"rejected": reason, "retry_after_s": self._ctl.retry_after_s()}

    def _wake(self) -> None:
        for session_id, replica_id in self._ctl.drain(time.monotonic()).items():
            future = self._waiters.get(session_id)
            if future is not None and not future.done():
                future.set_result(replica_id)
            elif future is None:
                self._ctl.release(session_id)  # its caller gave up (restart, timeout race)

    def lookup(self, session_id: str) -> str | None:
        try:
            return self._ctl.placement(session_id).replica_id
        except UnknownSessionError:
            return None

    def release(self, session_id: str, context_tokens: int | None = None) -> None:
        self._ctl.release(session_id, context_tokens)
        self._wake()

    def replica_died(self, replica_id: str) -> list[str]:
        """Forget a dead replica so that nothing is routed to it until it reports again."""
        self._dead.add(replica_id)
        return self._ctl.forget_replica(replica_id)

    def pressure(self) -> dict:
        p = self._ctl.pressure(time.monotonic())
        return {**asdict(p), "used_frac": p.used_frac, "projected_frac": p.projected_frac}

    def replicas(self) -> dict:
        now = time.monotonic()
        live = set(self._ctl.live_replicas(now))
        out = {}
        for rid, r in self._ctl.reports().items():
            if rid in live:
                out[rid] = {**asdict(r), "headroom": self._ctl.headroom(rid),
                            "projected_used": self._ctl.projected_used(rid)}
        return out


def head_node_id() -> str | None:
    for node in ray.nodes():
        if node.get("Alive") and "node:__internal_head__" in node.get("Resources", {}):
            return node["NodeID"]
    return None


def get_or_create_scheduler(config):
    """The one central actor, created by whoever asks first (ingress or replica), on the head node."""
    head = head_node_id()
    strategy = NodeAffinitySchedulingStrategy(head, soft=False) if head else "DEFAULT"
    s = config.scheduler
    return CentralScheduler.options(
        name=s.actor_name, namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
        num_cpus=config.replicas.scheduler_num_cpus, scheduling_strategy=strategy,
    ).remote(s.demand_priors, config.limits.max_queue, s.stale_after_s, s.reserve_frac)
