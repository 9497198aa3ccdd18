"""Central memory-contention scheduler: the pure logic (no Ray, no vLLM).

Replicas report at a steady interval what their engines really hold: KV blocks used, running
sequences against `max_num_seqs`, requests waiting, and each open session's context tokens. A new
session is placed on a replica with room (`scheduler.replica_index`: in turn among those with room to
spare, else the roomiest): the projected
budget (blocks used now plus what every session there is still projected to grow by, a high
percentile of what sessions of its source type reached: `scheduler.demand`; a session whose
question arrived, its size now) may exceed the real
capacity by the `overcommit` factor, since the engine parks idle streams and evicts them under
pressure (they are recomputed when they resume), while the blocks really used and the context
accepted must fit the capacity, and a saturated engine takes nothing. Later chunks of a session
follow its placement (affinity). When no replica has room, the session waits in a bounded FIFO
queue (sessions recovering from a lost replica wait in their own queue, served first); the caller
refuses it (HTTP 429) when it could not start within its deadline, at once when the queue is full
and its recent drain rate says so (`scheduler.admission_queue.QueuedAdmissions`). A request
whose known size exceeds every replica's KV can never be placed (`fits_anywhere`).
Everything is rebuilt from reports after a restart.

Cost: admit, release and a one-session change are O(log R); a replica's report costs O(its own
sessions); nothing scans all sessions or all replicas (`scheduler.replica_index`). Placements that
their replica's reports stop listing are dropped after `grace_s`; one-shot requests hold a lease.
Admission slots (placements decided ahead for a caller): `scheduler.admission_slots`.
"""

from __future__ import annotations

import math

from scheduler.admission_queue import AdmissionQueues, Ask, QueuedAdmissions
from scheduler.admission_slots import SlotGrants
from scheduler.demand import DemandModel, desired_replicas
from scheduler.projection_audit import FinalSizes
from scheduler.queue_wait import QueueWait
from scheduler.pressure import ClusterPressure
from scheduler.replica_index import Placement, ReplicaIndex, ReplicaReport, ReplicaState, blocks_for

__all__ = ["AdmissionController", "AdmissionError", "ClusterPressure", "DemandModel", "Placement",
           "ReplicaReport", "UnknownSessionError", "blocks_for", "desired_replicas"]


class AdmissionError(Exception):
    """Base class of the admission logic's typed errors."""


class UnknownSessionError(AdmissionError):
    """The session id has no placement."""


class AdmissionController(QueuedAdmissions, SlotGrants):
    """Routing by projected KV headroom, session affinity and bounded admission queues."""

    def __init__(self, demand: DemandModel, max_queue: int = 16, stale_after_s: float = 10.0,
                 reserve_frac: float = 0.0, grace_s: float = 10.0, max_sessions: int = 1_000_000,
                 overcommit: float = 1.0):
        self.demand = demand
        self._index = ReplicaIndex(stale_after_s, reserve_frac, overcommit)
        self._largest = 0                  # the most tokens any replica's KV ever held
        self._placements: dict[str, Placement] = {}
        self._queue = AdmissionQueues(max_queue)
        self._queue_wait = QueueWait()     # how fast queued sessions start (full queue, Retry-After)
        self._dead: dict[str, float] = {}  # replica -> until when its (late) reports are ignored
        self._slot_seq = 0                 # admission slots granted so far (their ids)
        self.finals = FinalSizes()         # what ended sessions held (`scheduler.projection_audit`)
        self.rejected = 0
        self.dropped = 0                   # placements reconciled away (never opened, leaked, expired)
        self.configure(max_queue=max_queue, grace_s=grace_s, max_sessions=max_sessions)

    def configure(self, *, max_queue: int | None = None, stale_after_s: float | None = None,
                  reserve_frac: float | None = None, grace_s: float | None = None,
                  max_sessions: int | None = None, priors: dict[str, int] | None = None,
                  overcommit: float | None = None, growth_percentile: float | None = None) -> None:
        """Change settings in place (a redeploy); placements and learned demand are kept."""
        if max_queue is not None and max_queue < 0:
            raise ValueError("max_queue must be >= 0")
        if max_sessions is not None and max_sessions <= 0:
            raise ValueError("max_sessions must be > 0")
        if overcommit is not None and overcommit < 1.0:
            raise ValueError("overcommit must be >= 1")
        if max_queue is not None:
            self._queue.max_queue = max_queue
        self.grace_s = self.grace_s if grace_s is None else grace_s
        self.max_sessions = self.max_sessions if max_sessions is None else max_sessions
        if stale_after_s is not None:
            self._index.stale_after_s = stale_after_s
        # a replica silent this long died unnoticed: its placements go (a late report re-adopts them)
        self._index.forget_after_s = 2 * (self._index.stale_after_s + self.grace_s)
        reserve = self._index.reserve_frac if reserve_frac is None else reserve_frac
        over = self._index.overcommit if overcommit is None else overcommit
        if (reserve, over) != (self._index.reserve_frac, self._index.overcommit):
            self._index.set_limits(reserve, over)
        if priors:
            self.demand.set_priors(priors)
        if growth_percentile is not None:
            self.demand.set_percentile(growth_percentile)

    @property
    def max_queue(self) -> int:
        return self._queue.max_queue

    @property
    def stale_after_s(self) -> float:
        return self._index.stale_after_s

    @property
    def overcommit(self) -> float:
        return self._index.overcommit

    # ---- replica reports -------------------------------------------------------------------
    def report(self, report: ReplicaReport, now: float) -> None:
        """Record a report: adopt sessions we do not know, refresh sizes, drop what it no longer holds."""
        rid = report.replica_id
        if self._dead.get(rid, -math.inf) > now:
            return  # a late report of a replica declared dead
        r = self._index.replicas.get(rid)
        if r is None:
            r = self._index.replicas[rid] = ReplicaState(rid, report, now)
        self._index.begin(r)
        r.report = report
        self._largest = max(self._largest, report.kv_blocks_total * report.block_size)
        complete = set(report.complete)
        for sid, tokens in report.sessions.items():
            p = self._placements.get(sid) or self._adopt(r, sid, now)
            if p is None or p.replica_id != rid:
                continue  # placed elsewhere (a recovery moved it): its new replica wins
            r.take(p)
            p.current_blocks, p.seen_at, p.reported = blocks_for(tokens, report.block_size), now, True
            if sid in complete:  # no percentile: its final size is known
                p.reserved_blocks = p.current_blocks
            elif not p.sized:  # projected from its size now and what its type has learned since
                p.reserved_blocks = blocks_for(self.demand.expected_tokens(p.source_type, tokens),
                                               report.block_size)
            r.put(p)
        for sid, p in list(r.placements.items()):
            if sid not in report.sessions and self._expired(p, now):
                self._unplace(r, p)
                self.dropped += 1
        self._index.commit(r, now)

    def _adopt(self, r: ReplicaState, sid: str, now: float) -> Placement | None:
        if len(self._placements) >= self.max_sessions:
            return None
        source = r.report.source_types.get(sid, "")
        blocks = blocks_for(self.demand.expected_tokens(source), r.report.block_size)
        p = self._placements[sid] = r.placements[sid] = Placement(sid, r.replica_id, source, blocks, now)
        r.put(p)
        return p

    def _expire(self, now: float) -> None:
        """Stale replicas leave the totals; long-silent ones are forgotten with their placements."""
        for r in self._index.expire(now):
            for session_id in r.placements:
                self._placements.pop(session_id, None)
            self.dropped += len(r.placements)

    def _expired(self, p: Placement, now: float) -> bool:
        if p.lease_until is not None:
            return now > p.lease_until
        return now - p.seen_at > self.grace_s

    def _unplace(self, r: ReplicaState, p: Placement) -> None:
        r.slots -= p.slot
        r.take(p)
        r.placements.pop(p.session_id, None)
        self._placements.pop(p.session_id, None)

    def forget_replica(self, replica_id: str, now: float | None = None) -> list[str]:
        """Drop a dead replica; returns its sessions. With `now`, its late reports are ignored a while."""
        if now is not None:
            self._dead = {k: t for k, t in self._dead.items() if t > now}
            self._dead[replica_id] = now + self.stale_after_s
        r = self._index.remove(replica_id)
        lost = list(r.placements) if r is not None else []
        for session_id in lost:
            self._placements.pop(session_id, None)
        return lost

    def set_draining(self, replica_id: str, draining: bool = True) -> int:
        """A draining replica takes no new sessions; returns the sessions still placed on it."""
        r = self._index.replicas.get(replica_id)
        if r is None:
            return 0
        self._index.begin(r)
        r.draining = draining
        self._index.commit(r)
        return len(r.placements)

    def sessions_on(self, replica_id: str) -> int:
        r = self._index.replicas.get(replica_id)
        return len(r.placements) if r is not None else 0

    def any_live(self, now: float) -> bool:
        """Whether some replica reported recently (O(1)); none: they are starting, or all lost."""
        self._expire(now)
        return self._index.totals.replicas > 0

    def live_replicas(self, now: float) -> list[str]:
        self._expire(now)
        return self._index.live_ids()

    # ---- headroom ----------------------------------------------------------------------------
    def projected_used(self, replica_id: str) -> int:
        """Blocks used now plus what each session placed here is still expected to grow by."""
        return self._index.replicas[replica_id].projected

    def projections(self, replica_id: str) -> dict[str, int]:
        """Each session's projected final blocks on the replica (O(its sessions): audits, not a hot
        path); untaken admission slots are no sessions."""
        return {p.session_id: max(p.reserved_blocks, p.current_blocks) for p in self._sessions_on(replica_id)}

    def source_types(self, replica_id: str) -> dict[str, str]:
        """Each session's source type on the replica (O(its sessions): audits, not a hot path)."""
        return {p.session_id: p.source_type for p in self._sessions_on(replica_id)}

    def _sessions_on(self, replica_id: str):
        return (p for p in self._index.replicas[replica_id].placements.values() if not p.slot)

    def headroom(self, replica_id: str) -> int:
        return self._index.room(self._index.replicas[replica_id])

    def fits_anywhere(self, tokens: int) -> bool:
        """False when `tokens` exceed the KV of every replica that ever reported (never placeable);
        True while none has reported (nothing is known yet)."""
        return not self._largest or tokens <= self._largest

    def choose_replica(self, source_type: str, now: float, exclude: tuple[str, ...] = (),
                       tokens: int | None = None) -> str | None:
        """The next live replica in turn (`ReplicaIndex.next_in_turn`) if the new session's projected
        size fits there, else the roomiest if it fits there."""
        self._expire(now)
        tokens = self.demand.expected_tokens(source_type) if tokens is None else tokens
        for pick in (self._index.next_in_turn, self._index.roomiest):
            r = pick(now, exclude)
            if r is None:
                return None
            if self._index.room(r) >= blocks_for(tokens, r.report.block_size):
                return r.replica_id
        return None

    # ---- sessions ----------------------------------------------------------------------------
    def try_admit(self, session_id: str, source_type: str, now: float, exclude: tuple[str, ...] = (),
                  **ask) -> str | None:
        """Place the session now if a replica fits and nobody queued is ahead of it.

        `ask` holds `Ask`'s optional fields (tokens, recovery, lease_s).
        """
        return self.admit_ask(Ask(session_id, source_type, tuple(exclude), **ask), now)

    def admit_ask(self, ask: Ask, now: float) -> str | None:
        p = self._placements.get(ask.session_id)
        if p is not None:
            if p.replica_id not in ask.exclude:
                return p.replica_id  # affinity
            self.release(ask.session_id)  # it flees that replica: the old placement goes
        if not self._queue.may_go(ask) or len(self._placements) >= self.max_sessions:
            return None
        replica_id = self.choose_replica(ask.source_type, now, ask.exclude, ask.tokens)
        if replica_id is None:
            return None
        self._queue.remove(ask.session_id)
        tokens = self.demand.expected_tokens(ask.source_type) if ask.tokens is None else ask.tokens
        lease_until = None if ask.lease_s is None else now + ask.lease_s
        self._place(Placement(ask.session_id, replica_id, ask.source_type, 0, now, lease_until,
                              sized=ask.tokens is not None), tokens)
        return replica_id

    def _place(self, p: Placement, tokens: int) -> None:
        r = self._index.replicas[p.replica_id]
        self._index.begin(r)
        p.replica_id, p.reserved_blocks = r.replica_id, blocks_for(tokens, r.report.block_size)
        r.slots += p.slot
        r.last_placed = p.seen_at
        self._placements[p.session_id] = r.placements[p.session_id] = p
        r.put(p)
        self._index.commit(r)

    def session_count(self) -> int:
        return len(self._placements)

    def placement(self, session_id: str) -> Placement:
        try:
            return self._placements[session_id]
        except KeyError:
            raise UnknownSessionError(f"no placement for session {session_id!r}") from None

    def release(self, session_id: str, context_tokens: int | None = None) -> None:
        """The session ended; a finished one teaches the demand model the size it reached."""
        p = self._placements.pop(session_id, None)
        if p is None:
            return
        r = self._index.replicas.get(p.replica_id)
        if r is not None:
            self._index.begin(r)
            self._unplace(r, p)
            self._index.commit(r)
        if context_tokens is not None and context_tokens > 0:
            self.finals.add(session_id, context_tokens)
            if p.lease_until is None:
                self.demand.observe(p.source_type, context_tokens)

    def pressure(self, now: float) -> ClusterPressure:
        self._expire(now)
        t = self._index.totals
        return ClusterPressure(replicas=t.replicas, kv_blocks_total=t.kv_blocks_total,
                               kv_blocks_used=t.kv_blocks_used, kv_blocks_projected=t.kv_blocks_projected,
                               sessions=t.sessions, queued=self.queued(), rejected=self.rejected,
                               kv_blocks_budget=t.kv_blocks_budget, running=t.running,
                               max_num_seqs=t.max_num_seqs, waiting=t.waiting)

    def reports(self) -> dict[str, ReplicaReport]:
        return {rid: r.report for rid, r in self._index.replicas.items()}

    def is_draining(self, replica_id: str) -> bool:
        r = self._index.replicas.get(replica_id)
        return r is not None and r.draining
