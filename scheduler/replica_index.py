"""Per-replica KV accounting kept incrementally, and heaps that find the replica to place on.

A replica's room for a new session is the least of two: the projected budget's room (its
capacity times the overcommit factor, less the blocks used now plus what its sessions are still
projected to grow by) and the real room (its capacity less the blocks really used, or held by
context it accepted, whichever is more; a session placed since the replica's last report counts
its projected size there until a report lists it). None while its engine is saturated (a whole
batch waits).
The central scheduler must not scan sessions or replicas on a hot path: each replica keeps its
sums; cluster totals are kept as running sums over live replicas. Where a session goes comes from
two lazy heaps: one by turn (replicas with a good share of their KV free take sessions in turn,
least recently placed first, since KV is not what limits them: their prefills spread as evenly as
round-robin's; the others after them, most room first) and one by room alone, asked when the
first's choice has too little room for the session. Every change pushes new entries with a new
version, stale entries are skipped when they surface, and the heaps are rebuilt when stale entries
outnumber live ones.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass, field

# While a replica has this share of its capacity free, KV is not what limits it: new sessions go to
# such replicas in turn (the least recently placed first), which spreads their prefills as evenly as
# round-robin does; below it, the most room first (bench.cluster_sim: 64 replicas, 80% load).
ROOMY_FRAC = 0.25


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-max(tokens, 0) // block_size)


@dataclass(frozen=True)
class ReplicaReport:
    """What a replica says about itself; `sessions` maps open session id -> context tokens, and
    `complete` names those whose context is complete (their question arrived): they grow no more
    but by their answer."""

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
    max_num_seqs: int = 0             # the engine's sequence slots (0: not reported)
    running: int = 0                  # sequences the engine runs now
    waiting: int = 0                  # requests waiting in the engine's queue
    complete: tuple[str, ...] = ()    # sessions whose question arrived: their size now is final

    @property
    def saturated(self) -> bool:
        """A whole batch already waits in the engine: new work would not start soon."""
        return self.max_num_seqs > 0 and self.waiting >= self.max_num_seqs

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
    sized: bool = False               # its size was given (one-shot requests), not projected
    reported: bool = False            # a report listed it: its context is in the replica's figures

    @property
    def growth(self) -> int:
        return max(0, self.reserved_blocks - self.current_blocks)

    @property
    def committed(self) -> int:
        """Blocks it holds or surely will: its reported context, or its whole known size; until a
        report lists it, its projected size (no figure of the replica's shows it yet, and without
        it the roomiest replica would take every session placed before its next report)."""
        if self.sized:
            return max(self.current_blocks, self.reserved_blocks)
        return self.current_blocks if self.reported else self.reserved_blocks


@dataclass
class ReplicaState:
    replica_id: str
    report: ReplicaReport             # the latest one
    reported_at: float
    placements: dict[str, Placement] = field(default_factory=dict)
    growth: int = 0                   # sum of the placements' growth
    footprint: int = 0                # sum of the placements' max(reserved, current) blocks
    held: int = 0                     # sum of the placements' committed blocks (accepted context)
    draining: bool = False
    version: int = 0
    slots: int = 0                    # admission slots placed here and not yet taken
    last_placed: float = float("-inf")  # when a session was last placed here

    @property
    def projected(self) -> int:
        """Used blocks plus expected growth, and never less than the sessions' own expected sizes:
        context a replica accepted may not be in its KV yet (prefill still running)."""
        return max(self.report.kv_blocks_used + self.growth, self.footprint)

    def take(self, p: Placement) -> None:
        self.growth -= p.growth
        self.footprint -= max(p.reserved_blocks, p.current_blocks)
        self.held -= p.committed

    def put(self, p: Placement) -> None:
        self.growth += p.growth
        self.footprint += max(p.reserved_blocks, p.current_blocks)
        self.held += p.committed

    def capacity(self, reserve_frac: float) -> int:
        total = self.report.kv_blocks_total
        return total - int(total * reserve_frac)

    def budget(self, reserve_frac: float, overcommit: float) -> int:
        """Projected blocks admission allows: the capacity times the overcommit factor."""
        return int(self.capacity(reserve_frac) * overcommit)

    def headroom(self, reserve_frac: float, overcommit: float = 1.0) -> int:
        """Blocks a new session may still take: the least of the projected budget's room and the
        real room (blocks used, or held by accepted context, whichever is more); -1 while the
        engine is saturated."""
        if self.report.saturated:
            return -1
        real = self.capacity(reserve_frac) - max(self.report.kv_blocks_used, self.held)
        return min(self.budget(reserve_frac, overcommit) - self.projected, real)


@dataclass
class Totals:
    """Running sums over live replicas (the autoscaler's input), never recomputed by a scan."""

    replicas: int = 0
    kv_blocks_total: int = 0
    kv_blocks_used: int = 0
    kv_blocks_projected: int = 0
    kv_blocks_budget: int = 0
    sessions: int = 0
    running: int = 0
    max_num_seqs: int = 0
    waiting: int = 0

    def add(self, r: ReplicaState, sign: int, budget: int) -> None:
        self.replicas += sign
        self.kv_blocks_total += sign * r.report.kv_blocks_total
        self.kv_blocks_used += sign * r.report.kv_blocks_used
        self.kv_blocks_projected += sign * r.projected
        self.kv_blocks_budget += sign * budget
        self.sessions += sign * (len(r.placements) - r.slots)  # untaken admission slots are no sessions
        self.running += sign * r.report.running
        self.max_num_seqs += sign * r.report.max_num_seqs
        self.waiting += sign * r.report.waiting


class ReplicaIndex:
    """Replicas by id, liveness by report time, the totals and the headroom heap."""

    def __init__(self, stale_after_s: float, reserve_frac: float, overcommit: float = 1.0):
        self.stale_after_s = stale_after_s
        self.reserve_frac = reserve_frac
        self.overcommit = overcommit
        self.replicas: dict[str, ReplicaState] = {}
        self.totals = Totals()
        self.forget_after_s = 60.0
        self._live: OrderedDict[str, float] = OrderedDict()    # oldest report first
        self._silent: OrderedDict[str, float] = OrderedDict()  # stale ones, oldest report first
        self._heap: list[tuple[tuple[int, float, int], int, str]] = []  # by `rank`
        self._by_room: list[tuple[int, int, str]] = []               # by most room

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
            self._count(self.replicas[rid], -1)
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
            self._count(r, -1)

    def commit(self, r: ReplicaState, now: float | None = None) -> None:
        """Call after changing `r`; `now` marks a fresh report (the replica is live again)."""
        if now is not None:
            r.reported_at = now
            self._live.pop(r.replica_id, None)
            self._silent.pop(r.replica_id, None)
            self._live[r.replica_id] = now
        if r.replica_id in self._live:
            self._count(r, +1)
        r.version += 1
        if not r.draining:
            self._push(r)

    def remove(self, replica_id: str) -> ReplicaState | None:
        r = self.replicas.pop(replica_id, None)
        self._silent.pop(replica_id, None)
        if r is not None and self._live.pop(replica_id, None) is not None:
            self._count(r, -1)
        return r

    def _count(self, r: ReplicaState, sign: int) -> None:
        self.totals.add(r, sign, r.budget(self.reserve_frac, self.overcommit))

    def room(self, r: ReplicaState) -> int:
        """Blocks a new session may still take on `r` (`ReplicaState.headroom`)."""
        return r.headroom(self.reserve_frac, self.overcommit)

    def set_limits(self, reserve_frac: float, overcommit: float) -> None:
        """New reserve or overcommit (a redeploy): totals and heap follow."""
        live = [self.replicas[rid] for rid in self._live]
        for r in live:
            self._count(r, -1)
        self.reserve_frac, self.overcommit = reserve_frac, overcommit
        for r in live:
            self._count(r, +1)
        self.rebuild()

    def rank(self, r: ReplicaState) -> tuple[int, float, int]:
        """The turn heap's key, least first: roomy replicas (`ROOMY_FRAC` of their capacity free)
        least recently placed first, then the others; most room first among equals."""
        room = self.room(r)
        if room >= r.capacity(self.reserve_frac) * ROOMY_FRAC:
            return (0, r.last_placed, -room)
        return (1, 0.0, -room)

    def _push(self, r: ReplicaState) -> None:
        heapq.heappush(self._heap, (self.rank(r), r.version, r.replica_id))
        heapq.heappush(self._by_room, (-self.room(r), r.version, r.replica_id))
        if max(len(self._heap), len(self._by_room)) > 4 * len(self.replicas) + 64:
            self.rebuild()  # each heap pops its stale entries only as they surface

    def rebuild(self) -> None:
        listed = [r for r in self.replicas.values() if not r.draining]
        self._heap = [(self.rank(r), r.version, r.replica_id) for r in listed]
        self._by_room = [(-self.room(r), r.version, r.replica_id) for r in listed]
        heapq.heapify(self._heap)
        heapq.heapify(self._by_room)

    # ---- choice --------------------------------------------------------------------------
    def next_in_turn(self, now: float, exclude: frozenset[str] | tuple = ()) -> ReplicaState | None:
        """The live, non-draining, non-excluded replica first by `rank`. Call `expire(now)` first."""
        return self._top(self._heap, exclude)

    def roomiest(self, now: float, exclude: frozenset[str] | tuple = ()) -> ReplicaState | None:
        """The live, non-draining, non-excluded replica with the most room (`room`).

        Cost (both): O(log R) per stale or excluded entry met on the way (excluded ones are put
        back). Call `expire(now)` first.
        """
        return self._top(self._by_room, exclude)

    def _top(self, heap: list, exclude) -> ReplicaState | None:
        skipped = []
        found = None
        while heap:
            entry = heap[0]
            r = self.replicas.get(entry[2])
            if r is None or r.version != entry[1] or r.draining:
                heapq.heappop(heap)
            elif not self.is_live(r.replica_id):
                heapq.heappop(heap)  # pushed again by its next report
            elif r.replica_id in exclude:
                skipped.append(heapq.heappop(heap))
            else:
                found = r
                break
        for entry in skipped:
            heapq.heappush(heap, entry)
        return found
