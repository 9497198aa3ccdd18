"""Session-affinity request router for the engine replicas (Ray Serve's `RequestRouter` API).

Calls carry a `route_to` keyword (a replica's unique id) chosen by the central scheduler when the
session was admitted; the router sends the call there, so every chunk of a session reaches the
replica that holds its KV. Calls without it (OpenAI endpoints, stats) go to the replica with the
most free KV blocks according to `record_routing_stats`. When the named replica is gone (killed,
scaled down) the call goes to the best other replica, which answers `SessionNotFoundError`, and
the ingress replays the session's context log there (recovery).
"""

from __future__ import annotations

import time

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

# A session is admitted to a replica as soon as that replica reports to the central scheduler,
# which can be a moment before Serve's routers list it (a replica just added by autoscaling).
# Opening the session waits for it this long instead of landing on another replica; later calls
# fall back at once (their replica died: the other one answers SessionNotFound -> recovery).
OPEN_WAIT_S = 15.0


def _free_blocks(replica: RunningReplica) -> int:
    stats = replica.routing_stats or {}
    return int(stats.get("kv_blocks_free", 0))


def rank_for_request(candidates: list[RunningReplica], target: str | None) -> list[list[RunningReplica]]:
    """Pure ranking: the named replica alone, else all by free KV blocks (most first)."""
    if target:
        named = [r for r in candidates if r.replica_id.unique_id == target]
        if named:
            return [named]
    by_room = sorted(candidates, key=lambda r: (-_free_blocks(r), r.replica_id.unique_id))
    return [[r] for r in by_room]


class AffinityRouter(RequestRouter):
    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        target = None
        if pending_request is not None:
            target = pending_request.kwargs.get("route_to")
            if target and _waits_for(pending_request, target, candidate_replicas):
                return []  # Serve backs off and asks again with a fresh candidate list
        return rank_for_request(candidate_replicas, target)


def _waits_for(request: PendingRequest, target: str, candidates: list[RunningReplica]) -> bool:
    if any(r.replica_id.unique_id == target for r in candidates):
        return False
    opening = request.metadata.call_method == "open_session"
    return opening and time.time() - request.created_at < OPEN_WAIT_S
