"""Session-affinity request router for the engine replicas (Ray Serve's `RequestRouter` API).

Calls carry a `route_to` keyword (a replica's unique id) chosen by the central scheduler when the
session was admitted; the router sends the call there, so every chunk of a session reaches the
replica that holds its KV. Calls without it (OpenAI endpoints, stats) go to the replica with the
most free KV blocks according to `record_routing_stats`. When the named replica is gone (killed,
scaled down) the call goes to the best other replica, which answers `SessionNotFoundError`, and
the ingress replays the session's context there (recovery).

Only a replica the router has never listed is waited for (one just started); one it listed
before and no longer lists is gone, and calls for it fall back at once: a dead replica never
stalls routing. Each process records when its routers stopped routing to a replica
(`pipeline.routing_exits`: Serve's controller dropped it, or a call found its actor dead); the
ingress shows them in /v1/cluster, and the reliability drills time them per ingress.
"""

from __future__ import annotations

import time

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from pipeline import routing_exits

# A session is admitted to a replica as soon as that replica reports to the central scheduler,
# which can be a moment before Serve's routers list it (a replica just added by autoscaling).
# Opening the session waits for such a new replica this long instead of landing on another one;
# later calls, and calls for a replica this router listed before (it died), fall back at once
# (the other replica answers SessionNotFound -> recovery).
OPEN_WAIT_S = 15.0
SEEN_MAX = 4096  # replica ids remembered (a bounded set: a long-lived router sees many replicas)


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
    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        before = {replica_id.unique_id for replica_id in self.curr_replicas}
        super().update_replicas(replicas)
        now = {r.replica_id.unique_id for r in replicas}
        routing_exits.note(before - now)
        routing_exits.listed(now)

    def on_replica_actor_died(self, replica_id) -> None:
        super().on_replica_actor_died(replica_id)
        routing_exits.note([replica_id.unique_id])

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        seen = self._seen_ids(candidate_replicas)
        target = None
        if pending_request is not None:
            target = pending_request.kwargs.get("route_to")
            if target and _waits_for(pending_request, target, candidate_replicas, seen):
                return []  # Serve backs off and asks again with a fresh candidate list
        return rank_for_request(candidate_replicas, target)

    def _seen_ids(self, candidates: list[RunningReplica]) -> dict[str, None]:
        seen = getattr(self, "_seen", None)
        if seen is None:
            seen = self._seen = {}
        for r in candidates:
            seen[r.replica_id.unique_id] = None
        while len(seen) > SEEN_MAX:
            del seen[next(iter(seen))]  # oldest first (dicts keep insertion order)
        return seen


def _waits_for(request: PendingRequest, target: str, candidates: list[RunningReplica], seen) -> bool:
    """Wait only for a replica never listed yet (just started), and only to open a session."""
    if target in seen or any(r.replica_id.unique_id == target for r in candidates):
        return False
    opening = request.metadata.call_method == "open_session"
    return opening and time.time() - request.created_at < OPEN_WAIT_S
