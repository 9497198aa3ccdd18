"""Which engine replicas this process's routers list, and when they stopped routing to each one that
left (for the drills' timing).

Its own module because Serve pickles the request router class by value (its module's globals are
copied into each process that routes); a module the router imports is resolved by name there, so
the ingress and its routers share this record.
"""

from __future__ import annotations

import time

ROUTING_EXITS: dict[str, float] = {}  # replica id -> when a router here stopped using it (epoch s)
EXITS_MAX = 256
LISTED: set[str] = set()  # the replicas the routers here list now (the controller's latest list)


def listed(replica_ids) -> None:
    LISTED.clear()
    LISTED.update(replica_ids)


def note(replica_ids) -> None:
    """These replicas left the routers here (first exit counts)."""
    now = time.time()
    LISTED.difference_update(replica_ids)
    for replica_id in replica_ids:
        ROUTING_EXITS.setdefault(replica_id, now)
    while len(ROUTING_EXITS) > EXITS_MAX:
        del ROUTING_EXITS[next(iter(ROUTING_EXITS))]
