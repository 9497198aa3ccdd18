"""Session-affinity request router for the engine replicas (Ray Serve's `RequestRouter` API).

Calls carry a `route_to` keyword (a replica's unique id) chosen by the central scheduler when the
session was admitted; the router sends the call there, so every chunk of a session reaches the
replica that holds its KV. Calls without it (OpenAI endpoints, stats) go to the replica with the
most free KV blocks according to `record_routing_stats`. When the named replica is gone (killed,
scaled down) the call goes to the best other replica, which answers `SessionNotFoundError`, and
the ingress replays the session's context there (recovery), unless the stopping replica moved the
session meanwhile (`pipeline.replica.drain`): then the call goes where it is now.

Only a replica the router has never listed is waited for (one just started), and only by the
call that opens a session; the wait lets Serve back off between tries (`should_backoff`), so the
router's event loop keeps routing other calls and taking the controller's updates meanwhile
(without it Serve retried at once and the loop spun for the whole wait: every update to that
process's routers came up to 15 s late, the "late long poll" seen in earlier kill drills). One it
listed before and no longer lists is gone, and calls for it fall back at once: a dead replica never
stalls routing. Nor does the router wait for Serve's controller to say a replica died: Ray core in
the same process knows of it within ~0.1 s, the controller's health check later. So every
DEATH_CHECK_S the router drops each replica whose actor Ray's local view (no RPC) reports dead,
and it never lets a later controller update list such a replica again. Each process records
when its routers stopped routing to a replica (`pipeline.control.routing_exits`: Ray reported its actor
dead, Serve's controller dropped it, or a call found it dead); the ingress shows them in
/v1/cluster, and the reliability drills time them per ingress.
"""

from __future__ import annotations

import asyncio
import time
import weakref

from ray.core.generated import gcs_pb2  # a module: Serve's by-value pickling of this file imports it by name
from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from pipeline.control import routing_exits

# A session is admitted to a replica as soon as that replica reports to the central scheduler,
# which can be a moment before Serve's routers list it (a replica just added by autoscaling).
# Opening the session waits for such a new replica this long instead of landing on another one;
# later calls, and calls for a replica this router listed before (it died), fall back at once
# (the other replica answers SessionNotFound -> recovery).
OPEN_WAIT_S = 15.0
SEEN_MAX = 4096  # replica ids remembered (a bounded set: a long-lived router sees many replicas)
DEATH_CHECK_S = 0.5


def actor_dead(replica: RunningReplica) -> bool:
    """Ray core's view, in this process, of the replica's actor: a local lookup, no RPC. It is DEAD
    from ~0.1 s after the death once this process has called the actor (Serve's router probes every
    replica it is given); unknown (not dead) before."""
    handle = getattr(replica, "_actor_handle", None)  # Serve's wrapper keeps the handle private
    local_state = getattr(handle, "_get_local_state", None)
    return local_state is not None and local_state() == gcs_pb2.ActorTableData.DEAD


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
        if getattr(self, "_death_watch", None) is None:
            self._death_watch = self._event_loop.create_task(_drop_dead_replicas(weakref.ref(self)))
        before = {replica_id.unique_id for replica_id in self.curr_replicas}
        replicas = [r for r in replicas if not actor_dead(r)]  # a late update may still list one
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
            # Every answer here ranks all replicas (Serve's locality mixins say so the same way):
            # without it Serve retries an empty answer at once, with no await, and a wait below
            # spins the router's event loop for OPEN_WAIT_S (see module doc).
            pending_request.routing_context.should_backoff = True
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


async def _drop_dead_replicas(router_ref: weakref.ref) -> None:
    """Every DEATH_CHECK_S, drop the replicas whose actor Ray reports dead (see module doc). Holds
    the router weakly: the loop ends when the router is gone."""
    while (router := router_ref()) is not None:
        for replica in [r for r in router.curr_replicas.values() if actor_dead(r)]:
            router.on_replica_actor_died(replica.replica_id)
        del router
        await asyncio.sleep(DEATH_CHECK_S)
