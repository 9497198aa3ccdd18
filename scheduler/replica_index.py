"""Per-replica KV accounting kept incrementally, and a heap that finds the roomiest replica.

The central scheduler must not scan sessions or replicas on a hot path. Each replica keeps the sum
of what its placed sessions are still expected to grow by; cluster totals (blocks, projected use,
sessions) are kept as running sums over live replicas. The roomiest replica comes from a lazy max
heap keyed by projected headroom: every change pushes a new entry with a new version, stale entries
are skipped when they surface, and the heap is rebuilt when stale entries outnumber live ones.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass, field


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-max(tokens, 0) // block_size)


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
    """A session (or a leased one-shot request) placed on a replica."""

    session_id: str
    replica_id: str
    source_type: str
    reserved_blocks: int
    seen_at: float = 0.0              # admission, or the last report that listed it
    lease_until: float | None = None  # one-shot requests: dropped after this, reports or not
    current_blocks: int = 0           # as the replica last reported
    slot: bool = False                # an admission slot nobody took yet (scheduler.admission_slots)

    @property
    def growth(self) -> int:
        return max(0, self.reserved_blocks - self.current_blocks)


@dataclass
class ReplicaState:
    replica_id: str
    report: ReplicaReport             # the latest one
    reported_at: float
    placements: dict[str, Placement] = field(default_factory=dict)
    growth: int = 0                   # sum of the placements' growth
    footprint: int = 0                # sum of the placements' max(reserved, current) blocks
    draining: bool = False
    version: int = 0
    slots: int = 0                    # admission slots placed here and not yet taken

    @property
    def projected(self) -> int:
        """Used blocks plus expected growth, and never less than the sessions' own expected sizes:
        context a replica accepted may not be in its KV yet (prefill still running)."""
        return max(self.report.kv_blocks_used + self.growth, self.footprint)

    def take(self, p: Placement) -> None:
        self.growth -= p.growth
        self.footprint -= max(p.reserved_blocks, p.current_blocks)

    def put(self, p: Placement) -> None:
        self.growth += p.growth
        self.footprint += max(p.reserved_blocks, p.current_blocks)

    def headroom(self, reserve_frac: float) -> int:
        total = self.report.kv_blocks_total
        return total - int(total * reserve_frac) - self.projected


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


@dataclass
class Totals:
    """Running sums over live replicas (the autoscaler's input), never recomputed by a scan."""

    replicas: int = 0
    kv_blocks_total: int = 0
    kv_blocks_used: int = 0
    kv_blocks_projected: int = 0
    sessions: int = 0

    def add(self, r: ReplicaState, sign: int) -> None:
        self.replicas += sign
        self.kv_blocks_total += sign * r.report.kv_blocks_total
        self.kv_blocks_used += sign * r.report.kv_blocks_used
        self.kv_blocks_projected += sign * r.projected
        self.sessions += sign * (len(r.placements) - r.slots)  # untaken admission slots are no sessions


class ReplicaIndex:
    """Replicas by id, liveness by report time, the totals and the headroom heap."""

    def __init__(self, stale_after_s: float, reserve_frac: float):
        self.stale_after_s = stale_after_s
        self.reserve_frac = reserve_frac
        self.replicas: dict[str, ReplicaState] = {}
        self.totals = Totals()
        self.forget_after_s = 60.0
        self._live: OrderedDict[str, float] = OrderedDict()    # oldest report first
        self._silent: OrderedDict[str, float] = OrderedDict()  # stale ones, oldest report first
        self._heap: list[tuple[int, int, str]] = []

    # ---- liveness ------------------------------------------------------------------------
    def expire(self, now: float) -> list[ReplicaState]:
        """Replicas silent past `stale_after_s` leave the totals; past `forget_after_s` they are
        removed and returned (a replica that died unnoticed). Cost: the number that expire."""
        while self._live:
            rid, at = next(iter(self._live.items()))
            if now - at <= self.stale_after_s:
                break
            del self._live[rid]
            self._silent[rid] = at
            self.totals.add(self.replicas[rid], -1)
        gone = []
        while self._silent:
            rid, at = next(iter(self._silent.items()))
            if now - at <= self.forget_after_s:
                break
            del self._silent[rid]
            gone.append(self.replicas.pop(rid))
        return gone

    def is_live(self, replica_id: str) -> bool:
        return replica_id in self._live

    def live_ids(self) -> list[str]:
        return list(self._live)

    # ---- changes -------------------------------------------------------------------------
    def begin(self, r: ReplicaState) -> None:
        """Call before changing `r`: takes its share out of the totals."""
        if r.replica_id in self._live:
            self.totals.add(r, -1)

    def commit(self, r: ReplicaState, now: float | None = None) -> None:
        """Call after changing `r`; `now` marks a fresh report (the replica is live again)."""
        if now is not None:
            r.reported_at = now
            self._live.pop(r.replica_id, None)
            self._silent.pop(r.replica_id, None)
            self._live[r.replica_id] = now
        if r.replica_id in self._live:
            self.totals.add(r, +1)
        r.version += 1
        if not r.draining:
            self._push(r)

    def remove(self, replica_id: str) -> ReplicaState | None:
        r = self.replicas.pop(replica_id, None)
        self._silent.pop(replica_id, None)
        if r is not None and self._live.pop(replica_id, None) is not None:
            self.totals.add(r, -1)
        return r

    def _push(self, r: ReplicaState) -> None:
        key = -r.headroom(self.reserve_frac) * r.report.block_size  # headroom in tokens
        heapq.heappush(self._heap, (key, r.version, r.replica_id))
        if len(self._heap) > 4 * len(self.replicas) + 64:
            self.rebuild()

    def rebuild(self) -> None:
        self._heap = [(-r.headroom(self.reserve_frac) * r.report.block_size, r.version, rid)
                      for rid, r in self.replicas.items() if not r.draining]
        heapq.heapify(self._heap)

    # ---- choice --------------------------------------------------------------------------
    def roomiest(self, now: float, exclude: frozenset[str] | tuple = ()) -> ReplicaState | None:
        """The live, non-draining, non-excluded replica with the most projected headroom.

        Cost: O(log R) per stale or excluded entry met on the way (excluded ones are put back).
        Call `expire(now)` first.
        """
        skipped = []
        found = None
        while self._heap:
            entry = self._heap[0]
            r = self.replicas.get(entry[2])
            if r is None or r.version != entry[1] or r.draining:
                heapq.heappop(self._heap)
            elif not self.is_live(r.replica_id):
                heapq.heappop(self._heap)  # pushed again by its next report
            elif r.replica_id in exclude:
                skipped.append(heapq.heappop(self._heap))
            else:
                found = r
                break
        for entry in skipped:
            heapq.heappush(self._heap, entry)
        return found
