"""The central memory-contention scheduler, as the central actor runs it: the real
`scheduler.admission.AdmissionController` (with its `ReplicaIndex` and `DemandModel`), fed with
replica reports every `report_interval_s` and nothing in between.

Each replica reports what its simulated engine holds (KV blocks used, sessions and their context
tokens, running and waiting sequences), its first report at start-up and then at its own phase of
the interval, so the controller's view of a replica is up to one interval old. A session the
controller cannot place waits in its queue (no deadline here: the wait counts in its TTFT) and is
handed out by `drain` after a report or a release, as the actor does. A finished session is
released with the context size it reached (the demand model learns from it).
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler.admission import AdmissionController, DemandModel, ReplicaReport
from scheduler.simulator.routers.base import SessionAsk

# the central actor's defaults (pipeline.config.SchedulerSettings); the benchmark passes its own
DEFAULT_PRIORS = {"crawler": 4096, "vector": 2048}


def replica_report(replica_id: str, engine, source_types: dict[str, str]) -> ReplicaReport:
    """What the replica's engine plug-in would report about `engine` (a `SimEngine`) now."""
    views = engine.views
    running = sum(1 for v in views.values() if v.running)
    return ReplicaReport(
        replica_id=replica_id, kv_blocks_total=engine.config.num_blocks,
        kv_blocks_used=engine.config.num_blocks - engine.blocks.num_free(),
        block_size=engine.config.block_size, sessions_active=running,
        sessions_idle=len(views) - running, queue_depth=len(views) - running,
        sessions={rid: v.num_prompt_tokens for rid, v in views.items()},
        source_types={rid: source_types.get(rid, "") for rid in views},
        preemptions=sum(engine.stats.preemptions.values()), running=running,
        waiting=len(views) - running, complete=tuple(rid for rid, v in views.items() if v.complete))


class CentralRouter:
    name = "central"

    def __init__(self, report_interval_s: float = 1.0, priors: dict[str, int] | None = None,
                 overcommit: float = 2.0, stale_after_s: float = 5.0, reserve_frac: float = 0.05,
                 growth_percentile: float = 0.9, grace_s: float = 10.0, max_queue: int = 1_000_000,
                 **_settings):
        if report_interval_s <= 0:
            raise ValueError("report_interval_s must be > 0")
        self.report_interval_s = report_interval_s
        self.controller = AdmissionController(
            DemandModel(dict(DEFAULT_PRIORS if priors is None else priors), percentile=growth_percentile),
            max_queue=max_queue, stale_after_s=stale_after_s, reserve_frac=reserve_frac,
            grace_s=grace_s, overcommit=overcommit)
        self._source_types: dict[str, str] = {}
        self.reports = 0
        self._since_report: dict[int, int] = {}  # sessions placed on a replica since its last report
        self.most_between_reports = 0

    def bind(self, replicas: Sequence, now: float) -> None:
        self.replicas = replicas
        for e in range(len(replicas)):
            self.on_report(e, now)

    def place(self, ask: SessionAsk, now: float) -> int | None:
        self._source_types[ask.session_id] = ask.source_type
        placed = self.controller.try_admit(ask.session_id, ask.source_type, now)
        if placed is None:
            if not self.controller.enqueue(ask.session_id, ask.source_type, now):
                raise RuntimeError(f"admission queue full ({self.controller.max_queue}): raise max_queue")
            return None
        return self._placed(_index(placed))

    def _placed(self, replica: int) -> int:
        count = self._since_report[replica] = self._since_report.get(replica, 0) + 1
        self.most_between_reports = max(self.most_between_reports, count)
        return replica

    def stats(self) -> dict:
        """The most sessions placed on one replica between two of its reports (stale decisions)."""
        return {"reports": self.reports, "most_placed_between_reports": self.most_between_reports}

    def on_report(self, replica: int, now: float) -> None:
        self.reports += 1
        self._since_report[replica] = 0
        self.controller.report(replica_report(f"r{replica}", self.replicas[replica], self._source_types), now)

    def on_finish(self, session_id: str, replica: int, context_tokens: int, now: float) -> None:
        self._source_types.pop(session_id, None)
        self.controller.release(session_id, context_tokens)

    def admitted(self, now: float) -> list[tuple[str, int]]:
        return [(sid, self._placed(_index(rid))) for sid, rid in self.controller.drain(now).items()]


def _index(replica_id: str) -> int:
    return int(replica_id[1:])
