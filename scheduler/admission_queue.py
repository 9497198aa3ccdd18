"""The admission wait queues: sessions recovering from a lost replica first, then new sessions;
and the admission controller's queue operations (`QueuedAdmissions`)."""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

OVERFLOW = 8  # a full queue takes asks estimated to start in time, up to this many times max_queue


@dataclass(frozen=True)
class Ask:
    """One admission request: what to place and where it must not go."""

    session_id: str
    source_type: str
    exclude: tuple[str, ...] = ()
    tokens: int | None = None          # expected context tokens when known (one-shot requests)
    recovery: bool = False             # fleeing the replicas in `exclude`: served before new ones
    lease_s: float | None = None       # one-shot requests: the placement expires after this


class AdmissionQueues:
    """Two bounded FIFO queues; recoveries have their own, so new sessions cannot crowd them out."""

    def __init__(self, max_queue: int):
        self.max_queue = max_queue
        self._recoveries: OrderedDict[str, Ask] = OrderedDict()
        self._newcomers: OrderedDict[str, Ask] = OrderedDict()

    def __len__(self) -> int:
        return len(self._recoveries) + len(self._newcomers)

    def may_go(self, ask: Ask) -> bool:
        """Recoveries wait only behind recoveries; new sessions behind everybody queued."""
        if ask.recovery:
            return not self._recoveries or next(iter(self._recoveries)) == ask.session_id
        return not self._recoveries and (not self._newcomers or next(iter(self._newcomers)) == ask.session_id)

    def head(self) -> Ask | None:
        for queue in (self._recoveries, self._newcomers):
            if queue:
                return next(iter(queue.values()))
        return None

    def position(self, ask: Ask) -> int:
        """Where the ask would stand if it joined now (1: the head)."""
        return (len(self._recoveries) if ask.recovery else len(self)) + 1

    def add(self, ask: Ask, limit: int | None = None) -> bool:
        """False when the ask's queue holds `limit` (default `max_queue`) already: not queued."""
        queue = self._recoveries if ask.recovery else self._newcomers
        if ask.session_id in queue:
            return True
        if len(queue) >= (self.max_queue if limit is None else limit):
            return False
        queue[ask.session_id] = ask
        return True

    def remove(self, session_id: str) -> bool:
        """True when the session was queued."""
        a = self._recoveries.pop(session_id, None)
        b = self._newcomers.pop(session_id, None)
        return a is not None or b is not None


class QueuedAdmissions:
    """The queue operations of `scheduler.admission.AdmissionController` (a mixin over its queue,
    `_queue_wait`: `scheduler.queue_wait.QueueWait`, and `admit_ask`).

    A queue holding `max_queue` asks still takes one whose estimated start (its position over the
    rate queued sessions were placed lately) is within its deadline, up to `OVERFLOW` times
    `max_queue`; else the ask is refused at once, with a Retry-After from the same estimate."""

    def enqueue(self, session_id: str, source_type: str, now: float, exclude: tuple[str, ...] = (),
                count_rejection: bool = True, deadline_s: float | None = None, **ask) -> bool:
        """Join the wait queue; False (and counted as rejected, unless told not to) when it is full
        and it would not start within `deadline_s` seconds (no deadline: full is full)."""
        a = Ask(session_id, source_type, tuple(exclude), **ask)
        if self._queue.add(a) or (self.starts_within(a, now, deadline_s)
                                  and self._queue.add(a, limit=OVERFLOW * self._queue.max_queue)):
            return True
        self.rejected += count_rejection
        return False

    def starts_within(self, ask: Ask, now: float, deadline_s: float | None) -> bool:
        """Whether the ask, joining the queue now, is estimated to start within `deadline_s`."""
        if deadline_s is None:
            return False
        wait = self._queue_wait.wait_s(self._queue.position(ask), now)
        return wait is not None and wait <= deadline_s

    def leave_queue(self, session_id: str, rejected: bool = True) -> None:
        if self._queue.remove(session_id) and rejected:
            self.rejected += 1

    def drain(self, now: float) -> dict[str, str]:
        """Admit queued sessions (recoveries first, FIFO) while they fit; returns session -> replica."""
        admitted = {}
        while (head := self._queue.head()) is not None:
            replica_id = self.admit_ask(head, now)
            if replica_id is None:
                break
            admitted[head.session_id] = replica_id
            self._queue_wait.note(now)
        return admitted

    def queued(self) -> int:
        return len(self._queue)

    def retry_after_s(self, base_s: float = 1.0, now: float | None = None) -> int:
        """A hint for clients: when a session joining the queue now would start (`QueueWait`), or,
        without an estimate (or `now`), `base_s` per session waiting."""
        fallback = base_s * (1 + self.queued())
        if now is None:
            return max(1, math.ceil(fallback))
        return self._queue_wait.retry_after_s(len(self._queue) + 1, now, fallback)
