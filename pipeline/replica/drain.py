"""A scale-down that drains: the stopping replica moves its open streaming sessions to another
replica before it stops, so that their next call finds them ready instead of replaying them.

What Ray Serve 2.60 does when it stops a replica (downscale, redeploy): it takes the replica out of
every router's list, waits until the calls in flight there have finished (polling every
`graceful_shutdown_wait_loop_s`; an answer being streamed is such a call, so it finishes where it
started), refuses further handle calls, then runs the replica's `__del__`, and kills the actor
`graceful_shutdown_timeout_s` after the stop began. A `/v1/streams` session between two calls is
no call in flight: without this module its next call reached another replica, which did not know
it, and the ingress replayed its whole context there (`EngineClient.recover`).

In `__del__` the replica (already marked draining at the central scheduler, so no new session is
placed on it) moves each session the session store holds for it, a few at a time:
1. `SessionStore.begin_move` marks the record moving (one mover at a time; the client's next read of
   the session waits for the move to end);
2. the central scheduler places it elsewhere (`admit(..., recovery=True)`, this replica excluded);
3. the chosen replica `adopt`s it: opens it and prefills its logged context, its other calls there
   waiting until that is done;
4. `end_move` records the new replica. A move that fails (no room, an error, the drain's time
   budget spent) leaves the record as it was, and the next call replays the session as before.
Outcomes are counted at the central scheduler (`CentralScheduler.note_moves`: `moved`,
`move_failed`; the ingress counts `replayed`). One-request sessions (`/v1/rag`) are calls in flight,
finished by Serve's wait, and are not moved; nor is anything when the whole application is being
deleted (`serve shutdown`): there is nowhere to move to.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Iterable

from ray import serve

from pipeline.errors import admission_error
from pipeline.sessions.store import SessionStore

log = logging.getLogger("stream2llm.drain")

MOVES_AT_ONCE = 4          # sessions prefilled on other replicas at the same time
ADMIT_TIMEOUT_FRAC = 0.5   # of the drain's budget, for one session's placement
# Of `replicas.drain_timeout_s` (Serve's graceful_shutdown_timeout_s, which also covers waiting for
# the calls in flight), the part the stopping replica spends moving its open sessions.
DRAIN_BUDGET_FRAC = 0.6


async def move_out(replica_id: str, session_ids: list[str], config, scheduler) -> Counter:
    """From the stopping replica's `__del__`: move `session_ids` (sessions of the store open there)
    through the engine deployment's own handle, and add the outcomes to the central scheduler's."""
    deployment = serve.get_replica_context().replica_id.deployment_id
    if not await _app_stays(deployment.app_name):
        log.info("replica %s stopping with its application: its %d open sessions end with it",
                 replica_id, len(session_ids))
        return Counter()
    try:
        handle = serve.get_deployment_handle(deployment.name, deployment.app_name)
        mover = SessionMover(replica_id, SessionStore(config), scheduler, handle,
                             budget_s=config.replicas.drain_timeout_s * DRAIN_BUDGET_FRAC)
        outcomes = await mover.move_all(session_ids)
    except Exception as e:  # noqa: BLE001 - the sessions are then replayed on their next call
        log.warning("moving %d sessions off %s failed: %r", len(session_ids), replica_id, e)
        outcomes = Counter(move_failed=len(session_ids))
    log.info("replica %s stopping: its open sessions %s", replica_id, dict(outcomes))
    with contextlib.suppress(Exception):
        await asyncio.wait_for(scheduler.note_moves.remote(dict(outcomes)), 5.0)
    return outcomes


async def _app_stays(app_name: str) -> bool:
    """Whether the application goes on (a scale-down, a redeploy), not being deleted (`serve
    shutdown`, `serve delete`): then there is nowhere to move to."""
    def status() -> str:
        app = serve.status().applications.get(app_name)
        return "" if app is None else str(getattr(app.status, "value", app.status))

    try:
        return (await asyncio.wait_for(asyncio.to_thread(status), 10.0)) not in ("", "DELETING")
    except Exception:  # noqa: BLE001 - the controller gone or shutting down: so is the application
        return False


class SessionMover:
    """Moves the sessions of one stopping replica (see module doc). Collaborators: the session
    store, the central scheduler's actor handle, the engine deployment's Serve handle."""

    def __init__(self, replica_id: str, store, scheduler, engine_handle, budget_s: float):
        self.replica_id = replica_id
        self._store, self._scheduler, self._handle = store, scheduler, engine_handle
        self._budget_s = budget_s
        self.outcomes: Counter = Counter()

    async def move_all(self, session_ids: Iterable[str]) -> Counter:
        """Move every session it can within the budget; returns the outcomes (`moved`,
        `move_failed`, `not_held`: finished, moved or being changed meanwhile)."""
        gate = asyncio.Semaphore(MOVES_AT_ONCE)

        async def one(session_id: str) -> None:
            async with gate:
                self.outcomes[await self.move(session_id)] += 1

        tasks = [asyncio.ensure_future(one(sid)) for sid in session_ids]
        if tasks:
            done, pending = await asyncio.wait(tasks, timeout=self._budget_s)
            for task in pending:  # out of time: their moves end as failed (`move`'s finally)
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            if pending:
                self.outcomes["move_failed"] += len(pending)
        return self.outcomes

    async def move(self, session_id: str) -> str:
        session = await self._store.begin_move(session_id, self.replica_id, yield_to_changes=True)
        if session is None:
            return "not_held"
        moved = False
        try:
            decision = await self._scheduler.admit.remote(
                session_id, session.source_type, self._budget_s * ADMIT_TIMEOUT_FRAC, [self.replica_id],
                recovery=True)
            if (error := admission_error(decision)) is not None:
                log.warning("session %s not moved off %s: %s", session_id, self.replica_id, error)
                return "move_failed"
            target = decision["replica_id"]
            info = await self._handle.adopt.remote(session_id, session.source_type, session.replay_ops(),
                                                   session.last_seq, route_to=target)
            if info["replica_id"] != target:  # routed elsewhere: its holder's next report adopts it
                self._scheduler.release.remote(session_id)
            session.replica_id, session.node_id = info["replica_id"], info["node_id"]
            session.context_tokens = info["context_tokens"]
            moved = True
            return "moved"
        except Exception as e:  # noqa: BLE001 - any failure leaves the session to be replayed
            log.warning("session %s not moved off %s: %r", session_id, self.replica_id, e)
            return "move_failed"
        finally:
            await asyncio.shield(self._store.end_move(session if moved else None, session_id))
