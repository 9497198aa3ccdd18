"""Admission slots: placements decided ahead, handed out by their holder without a round trip.

Part of `scheduler.admission.AdmissionController` (a mixin over its placements and replica index).
An ingress process that admits many sessions holds a few slots per source type; an admission takes
one locally (microseconds instead of an actor call) and the binding (which session took which slot)
follows in the holder's next batch. Slots are granted only while nobody waits in the queue
(holders give theirs back once somebody does: `pipeline.control.central_client`), and on a replica only
while it keeps free room for more sessions than it has slots (slots take at most half of any
replica's free room), so under pressure admissions go through `try_admit` and the queue. An unused
slot is a placement with a lease: it expires like a one-shot request's. Their cost: that reserved
headroom (in projected blocks like any placement; not counted as sessions), bounded by holders x
slots x demand, for at most the lease.
"""

from __future__ import annotations

from scheduler.replica_index import Placement, blocks_for


class SlotGrants:
    """`grant_slots` and `bind_slot` of the admission controller."""

    def grant_slots(self, holder: str, source_type: str, count: int, now: float,
                    ttl_s: float) -> list[tuple[str, str]]:
        """Up to `count` placements decided ahead for `holder`: [(slot id, replica id)].

        Each is a placement under a slot id with a lease of `ttl_s`; none while anybody is queued,
        and a replica's slots take at most half of its free room (see the module docstring).
        """
        granted = []
        tokens = self.demand.expected_tokens(source_type)
        self._expire(now)
        while len(granted) < count and not self.queued() and len(self._placements) < self.max_sessions:
            r = self._slot_replica(tokens, now)
            if r is None:
                break
            self._slot_seq += 1
            slot_id = f"slot:{holder}:{self._slot_seq}"
            self._place(Placement(slot_id, r.replica_id, source_type, 0, now, now + ttl_s, slot=True), tokens)
            granted.append((slot_id, r.replica_id))
        return granted

    def _slot_replica(self, tokens: int, now: float):
        """Where the next slot goes: the next replica in turn, as `choose_replica` places sessions,
        else the roomiest, if it keeps free room for two more sessions than its slots."""
        for pick in (self._index.next_in_turn, self._index.roomiest):
            r = pick(now, ())
            if r is not None and self._index.room(r) >= (2 + r.slots) * blocks_for(tokens, r.report.block_size):
                return r
        return None

    def bind_slot(self, slot_id: str, session_id: str, replica_id: str, source_type: str, now: float) -> None:
        """Session `session_id` took slot `slot_id` (on `replica_id`): the placement becomes its.

        A slot that expired meanwhile still names where the session went: it is placed there when
        that replica is known (else the replica's next report adopts it).
        """
        slot = self._placements.get(slot_id)
        if slot is not None:
            self.release(slot_id)
        r = self._index.replicas.get(replica_id)
        if r is None or session_id in self._placements:
            return
        tokens = self.demand.expected_tokens(source_type)
        self._place(Placement(session_id, replica_id, source_type, 0, now), tokens)
