"""When this process's routers stopped routing to each replica that left (for the drills' timing).

Its own module because Serve pickles the request router class by value (its module's globals are
copied into each process that routes); a module the router imports is resolved by name there, so
the ingress and its routers share this record.
"""

from __future__ import annotations

import time

ROUTING_EXITS: dict[str, float] = {}  # replica id -> when a router here stopped using it (epoch s)
EXITS_MAX = 256


def note(replica_ids) -> None:
    now = time.time()
    for replica_id in replica_ids:
        ROUTING_EXITS.setdefault(replica_id, now)  # the first exit counts
    while len(ROUTING_EXITS) > EXITS_MAX:
        del ROUTING_EXITS[next(iter(ROUTING_EXITS))]
