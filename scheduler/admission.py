"""Central memory-contention scheduler: the pure logic (no Ray, no vLLM).

Replicas report their KV blocks and open sessions at a steady interval. A new session is placed on
the replica with the most *projected* KV headroom: blocks used now, plus what every session placed
there is still expected to grow by (expected demand per source type, learned from finished
sessions). Later chunks of a session follow its placement (affinity). When no replica can take the
expected demand, the session waits in a bounded FIFO queue; the caller rejects it (HTTP 429) when
the queue is full or the wait times out. Everything is rebuilt from reports after a restart.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field


class AdmissionError(Exception):
    """Base class of the admission logic's typed errors."""


class UnknownSessionError(AdmissionError):
    """The session id has no placement."""


@dataclass(frozen=True)
class ReplicaReport:
    """What a replica says about itself; `sessions` maps open session id -> context tokens."""

    replica_id: str
    kv_blocks_total: int
    kv_blocks_used: int
    block_size: int
    sessions_active: int = 0
    sessions_idle: int = 0
    queue_depth: int = 0
    sessions: dict[str, int] = field(default_factory=dict)
    source_types: dict[str, str] = field(default_factory=dict)
    node_id: str = ""
    preemptions: int = 0

    def __post_init__(self):
        if self.kv_blocks_total <= 0 or self.block_size <= 0:
            raise ValueError("kv_blocks_total and block_size must be positive")


@dataclass
class Placement:
    session_id: str
    replica_id: str
    source_type: str
    reserved_blocks: int


@dataclass
class _Waiter:
    session_id: str
    source_type: str
    enqueued_at: float


@dataclass(frozen=True)
class ClusterPressure:
    """Cluster-wide KV pressure, the input of autoscaling."""

    replicas: int
    kv_blocks_total: int
    kv_blocks_used: int
    kv_blocks_projected: int
    sessions: int
    queued: int
    rejected: int

    @property
    def used_frac(self) -> float:
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0

    @property
    def projected_frac(self) -> float:
        return self.kv_blocks_projected / self.kv_blocks_total if self.kv_blocks_total else 0.0


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
        seen = self.observations.get(source_type, 0)
        old = self._tokens.get(source_type)
        # The first real observation replaces a prior wholesale only when there is no prior.
        self._tokens[source_type] = float(tokens) if old is None else old + self._alpha * (tokens - old)
        self.observations[source_type] = seen + 1


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-max(tokens, 0) // block_size)


class AdmissionController:
    """Routing by projected KV headroom, session affinity and a bounded admission queue."""

    def __init__(self, demand: DemandModel, max_queue: int = 16, stale_after_s: float = 10.0,
                 reserve_frac: float = 0.0):
        if max_queue < 0:
            raise ValueError("max_queue must be >= 0")
        self.demand = demand
        self.max_queue = max_queue
        self.stale_after_s = stale_after_s
        self.reserve_frac = reserve_frac
        self._reports: dict[str, ReplicaReport] = {}
        self._reported_at: dict[str, float] = {}
        self._placements: dict[str, Placement] = {}
        self._queue: OrderedDict[str, _Waiter] = OrderedDict()
        self.rejected = 0

    # ---- replica reports -------------------------------------------------------------------
    def report(self, report: ReplicaReport, now: float) -> None:
        """Record a replica's report; sessions it holds that we do not know are adopted."""
        self._reports[report.replica_id] = report
        self._reported_at[report.replica_id] = now
        for session_id in report.sessions:
            if session_id not in self._placements:
                source = report.source_types.get(session_id, "")
                blocks = blocks_for(self.demand.expected_tokens(source), report.block_size)
                self._placements[session_id] = Placement(session_id, report.replica_id, source, blocks)

    def forget_replica(self, replica_id: str) -> list[str]:
        """Drop a replica (dead); returns the sessions that were placed on it."""
        self._reports.pop(replica_id, None)
        self._reported_at.pop(replica_id, None)
        lost = [p.session_id for p in self._placements.values() if p.replica_id == replica_id]
        for session_id in lost:
            del self._placements[session_id]
        return lost

    def live_replicas(self, now: float) -> list[str]:
        return [r for r, t in self._reported_at.items() if now - t <= self.stale_after_s]

    # ---- headroom ----------------------------------------------------------------------------
    def projected_used(self, replica_id: str) -> int:
        """Blocks used now plus what each session placed here is still expected to grow by."""
        report = self._reports[replica_id]
        growth = 0
        for p in self._placements.values():
            if p.replica_id != replica_id:
                continue
            now_blocks = blocks_for(report.sessions.get(p.session_id, 0), report.block_size)
            growth += max(0, p.reserved_blocks - now_blocks)
        return report.kv_blocks_used + growth

    def headroom(self, replica_id: str) -> int:
        report = self._reports[replica_id]
        reserve = int(report.kv_blocks_total * self.reserve_frac)
        return report.kv_blocks_total - reserve - self.projected_used(replica_id)

    def choose_replica(self, source_type: str, now: float, exclude: tuple[str, ...] = ()) -> str | None:
        """The live replica with the most projected headroom that fits the expected demand."""
        best, best_room = None, None
        for replica_id in sorted(self.live_replicas(now)):
            if replica_id in exclude:
                continue
            need = blocks_for(self.demand.expected_tokens(source_type), self._reports[replica_id].block_size)
            room = self.headroom(replica_id)
            if room >= need and (best_room is None or room > best_room):
                best, best_room = replica_id, room
        return best

    # ---- sessions ----------------------------------------------------------------------------
    def try_admit(self, session_id: str, source_type: str, now: float,
                  exclude: tuple[str, ...] = ()) -> str | None:
        """Place the session now if a replica fits and nobody queued is ahead of it."""
        if session_id in self._placements:
            return self._placements[session_id].replica_id
        if self._queue and next(iter(self._queue)) != session_id:
            return None
        replica_id = self.choose_replica(source_type, now, exclude)
        if replica_id is None:
            return None
        self._queue.pop(session_id, None)
        self._place(session_id, replica_id, source_type)
        return replica_id

    def _place(self, session_id: str, replica_id: str, source_type: str) -> None:
        block_size = self._reports[replica_id].block_size
        blocks = blocks_for(self.demand.expected_tokens(source_type), block_size)
        self._placements[session_id] = Placement(session_id, replica_id, source_type, blocks)

    def enqueue(self, session_id: str, source_type: str, now: float) -> bool:
        """Join the wait queue; False (and counted as rejected) when it is full."""
        if session_id in self._queue:
            return True
        if len(self._queue) >= self.max_queue:
            self.rejected += 1
            return False
        self._queue[session_id] = _Waiter(session_id, source_type, now)
        return True

    def leave_queue(self, session_id: str, rejected: bool = True) -> None:
        if self._queue.pop(session_id, None) is not None and rejected:
            self.rejected += 1

    def drain(self, now: float) -> dict[str, str]:
        """Admit queued sessions in FIFO order while they fit; returns session -> replica."""
        admitted = {}
        while self._queue:
            head = next(iter(self._queue.values()))
            replica_id = self.try_admit(head.session_id, head.source_type, now)
            if replica_id is None:
                break
            admitted[head.session_id] = replica_id
        return admitted

    def queued(self) -> int:
        return len(self._queue)

    def placement(self, session_id: str) -> Placement:
        try:
            return self._placements[session_id]
        except KeyError:
            raise UnknownSessionError(f"no placement for session {session_id!r}") from None

    def move(self, session_id: str, replica_id: str) -> None:
        """Re-place a session on another replica (recovery after its replica died)."""
        placement = self.placement(session_id)
        placement.replica_id = replica_id

    def release(self, session_id: str, context_tokens: int | None = None) -> None:
        """The session ended; a finished one teaches the demand model its real size."""
        placement = self._placements.pop(session_id, None)
        if placement is not None and context_tokens is not None and context_tokens > 0:
            self.demand.observe(placement.source_type, context_tokens)

    def retry_after_s(self, base_s: float = 1.0) -> int:
        """A hint for clients: longer when more sessions wait."""
        return max(1, int(math.ceil(base_s * (1 + len(self._queue)))))

    def pressure(self, now: float) -> ClusterPressure:
        live = self.live_replicas(now)
        return ClusterPressure(
            replicas=len(live),
            kv_blocks_total=sum(self._reports[r].kv_blocks_total for r in live),
            kv_blocks_used=sum(self._reports[r].kv_blocks_used for r in live),
            kv_blocks_projected=sum(self.projected_used(r) for r in live),
            sessions=sum(1 for p in self._placements.values() if p.replica_id in live),
            queued=len(self._queue),
            rejected=self.rejected,
        )

    def reports(self) -> dict[str, ReplicaReport]:
        return dict(self._reports)


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
