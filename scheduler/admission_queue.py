"""The admission wait queues: sessions recovering from a lost replica first, then new sessions."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


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

    def add(self, ask: Ask) -> bool:
        """False when the ask's queue is full (it is then not queued)."""
        queue = self._recoveries if ask.recovery else self._newcomers
        if ask.session_id in queue:
            return True
        if len(queue) >= self.max_queue:
            return False
        queue[ask.session_id] = ask
        return True

    def remove(self, session_id: str) -> bool:
        """True when the session was queued."""
        a = self._recoveries.pop(session_id, None)
        b = self._newcomers.pop(session_id, None)
        return a is not None or b is not None
