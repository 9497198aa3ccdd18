"""Wiring of the central memory-contention scheduler: a named, restartable Ray actor on the control
node (`pipeline.control.home`).

The logic lives in `scheduler.admission` (pure). This actor adds waiting: an admission that cannot
be placed at once waits (bounded queue) until a replica report or a released session makes room,
or until its deadline; then the caller answers 429 with Retry-After, or 503 with Retry-After when
no replica has reported yet (replicas still starting). A request whose known size no replica's KV
holds is answered `never_fits` at once (a 400: waiting cannot help). After a restart the actor
starts empty and rebuilds its view from the next round of replica reports (they list their open
sessions).

Settings: the detached actor outlives deployments, so whoever resolves it (`get_or_create_scheduler`,
called by every ingress and replica at start) publishes the current settings in Ray's GCS key-value
store and calls `configure()`; a restarted actor reads them back from there, not from the arguments
it was first created with.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict

import ray

from pipeline.control.home import control_placement
from scheduler.admission import AdmissionController, DemandModel, ReplicaReport, UnknownSessionError

NAMESPACE = "stream2llm"
# How sessions left a replica's KV for another's, counted since the actor started: `moved` (a
# scale-down's victim prefilled it on another replica before stopping), `move_failed` (no room, an
# error, or its drain ran out of time: the next call replays it), `replayed` (a call found its
# replica gone or stopped and rebuilt the context from scratch: `EngineClient.recover`).
MOVE_OUTCOMES = ("moved", "move_failed", "replayed")
ONESHOT_SOURCE = "oneshot"


class SchedulerUnavailable(RuntimeError):
    """The central scheduler did not answer in time (restarting, overloaded or gone)."""


def central_settings(config) -> dict:
    """What the central actor needs from an `AppConfig` (JSON-able)."""
    s = config.scheduler
    return {"priors": dict(s.demand_priors), "max_queue": config.limits.max_queue,
            "stale_after_s": s.stale_after_s, "reserve_frac": s.reserve_frac, "grace_s": s.grace_s,
            "max_sessions": s.max_sessions, "request_lease_s": s.request_lease_s,
            "admission_slot_s": s.admission_slot_s, "overcommit": s.overcommit,
            "growth_percentile": s.growth_percentile}


def _kv_key(actor_name: str) -> bytes:
    return f"stream2llm/central/{actor_name}".encode()


# Task events off: at thousands of calls per second they cost the actor (and its callers) CPU for
# a per-call record in Ray's state API that nobody reads at that rate.
@ray.remote(max_restarts=-1, max_task_retries=3, enable_task_events=False)
class CentralScheduler:
    def __init__(self, priors: dict, max_queue: int, stale_after_s: float, reserve_frac: float,
                 **settings):
        self._ctl = AdmissionController(DemandModel(priors), max_queue, stale_after_s, reserve_frac)
        self._lease_s = 600.0
        self._slot_s = 2.0
        self._closed: dict[str, float] = {}  # replica -> when it began draining or was found dead
        self._waiters: dict[str, asyncio.Future] = {}
        self._moves: dict[str, int] = dict.fromkeys(MOVE_OUTCOMES, 0)
        self.started_at = time.time()
        self.configure({**settings, **(self._published() or {})})

    def _published(self) -> dict | None:
        from ray.experimental.internal_kv import _internal_kv_get

        name = ray.get_runtime_context().get_actor_name()
        raw = _internal_kv_get(_kv_key(name), namespace=NAMESPACE) if name else None
        return json.loads(raw) if raw else None

    def configure(self, settings: dict) -> dict:
        """Apply new settings (a redeploy) without losing placements; returns what is in force."""
        s = dict(settings)
        self._lease_s = float(s.pop("request_lease_s", self._lease_s))
        self._slot_s = float(s.pop("admission_slot_s", self._slot_s))
        self._ctl.configure(**s)
        self._wake()
        return {"max_queue": self._ctl.max_queue, "stale_after_s": self._ctl.stale_after_s,
                "grace_s": self._ctl.grace_s, "max_sessions": self._ctl.max_sessions,
                "overcommit": self._ctl.overcommit, "growth_percentile": self._ctl.demand.percentile,
                "request_lease_s": self._lease_s, "admission_slot_s": self._slot_s}

    def ping(self) -> dict:
        return {"started_at": self.started_at, "node_id": ray.get_runtime_context().get_node_id()}

    def report(self, report: dict) -> dict:
        """A replica's periodic report; returns cluster pressure (replicas use it for autoscaling)."""
        self._ctl.report(ReplicaReport(**report), time.monotonic())
        self._wake()
        return self.pressure()

    async def admit(self, session_id: str, source_type: str, timeout_s: float,
                    exclude: list[str] | None = None, *, tokens: int | None = None,
                    recovery: bool = False, lease_s: float | None = None) -> dict:
        """Place a session; waits in the bounded queue. Returns {"replica_id"}, or {"rejected"}
        (429) or {"unavailable"} (503: no replica reported yet) with "retry_after_s", or
        {"never_fits"} (400: `tokens` exceed every replica's KV).

        `tokens`: expected context tokens when known; `recovery`: the session flees the replicas
        in `exclude` (served before new sessions, its old placement moves); `lease_s`: the
        placement expires after this unless released (one-shot requests).
        """
        ask = {"tokens": tokens, "recovery": recovery, "lease_s": lease_s}
        exclude_t = tuple(exclude or ())
        if tokens is not None and not self._ctl.fits_anywhere(tokens):
            return {"never_fits": f"{tokens} tokens exceed the KV cache of every replica"}
        now = time.monotonic()
        replica_id = self._ctl.try_admit(session_id, source_type, now, exclude_t, **ask)
        if replica_id is not None:
            return {"replica_id": replica_id}
        ready = self._ctl.any_live(now)  # else replicas are starting: "unavailable", no rejection
        if not self._ctl.enqueue(session_id, source_type, now, exclude_t, count_rejection=ready,
                                 deadline_s=timeout_s, **ask):
            return self._rejection("admission queue full, and queued work would not start within the deadline")
        future = self._waiters[session_id] = asyncio.get_running_loop().create_future()
        self._wake()
        try:
            return {"replica_id": await asyncio.wait_for(future, timeout_s)}
        except asyncio.TimeoutError:
            decision = self._rejection("no replica had room within the admission deadline")
            self._ctl.leave_queue(session_id, rejected="rejected" in decision)  # not-ready is no rejection
            return decision
        finally:
            self._waiters.pop(session_id, None)

    async def admit_request(self, request_id: str, tokens: int, timeout_s: float) -> dict:
        """Admit one-shot (OpenAI-compatible) traffic: `tokens` = prompt + max new tokens.

        The placement is a lease: `release(request_id)` when the request ends; else it expires.
        """
        return await self.admit(request_id, ONESHOT_SOURCE, timeout_s, tokens=tokens, lease_s=self._lease_s)

    def batch(self, releases: list, asks: list[dict], binds: list = (), want: dict | None = None,
              holder: str = "") -> dict:
        """One caller's batch: slot bindings, releases, admissions that do not wait, slot requests.

        `binds`: [slot_id, session_id, replica_id, source_type] of sessions that took admission
        slots (`scheduler.admission_slots`); `releases`: [session_id, context_tokens]; `asks`: each
        holds `admit`'s arguments but `timeout_s`, and its decision is {"replica_id"}, or None when
        it could not be placed at once (the caller then waits with `admit`); `want`: slots asked
        per source type for `holder`. Returns {"decisions", "slots": {type: [[slot, replica]]},
        "slot_s", "closed": replicas whose slots must not be used any more, "queued": whether
        sessions wait in the queue (holders then give their slots back: none jumps the queue)}.
        See `pipeline.control.central_client.CentralClient`.
        """
        now = time.monotonic()
        for slot_id, session_id, replica_id, source_type in binds:
            self._ctl.bind_slot(slot_id, session_id, replica_id, source_type, now)
        for session_id, context_tokens in releases:
            self._ctl.release(session_id, context_tokens)
        self._wake()
        decisions = []
        for ask in asks:
            ask = dict(ask)
            replica_id = self._ctl.try_admit(ask.pop("session_id"), ask.pop("source_type"), now,
                                             tuple(ask.pop("exclude", ())), **ask)
            decisions.append(None if replica_id is None else {"replica_id": replica_id})
        slots = {source: self._ctl.grant_slots(holder, source, count, now, self._slot_s)
                 for source, count in (want or {}).items()}
        return {"decisions": decisions, "slots": slots, "slot_s": self._slot_s,
                "closed": self._recently_closed(now), "queued": bool(self._ctl.queued())}

    def _recently_closed(self, now: float) -> list[str]:
        """Replicas that began draining or died within a slot lease: holders drop their slots there."""
        self._closed = {rid: t for rid, t in self._closed.items() if now - t < self._slot_s}
        return list(self._closed)

    def _rejection(self, reason: str) -> dict:
        now = time.monotonic()
        if not self._ctl.any_live(now):  # starting (or all lost): not the load's fault
            return {"unavailable": "no engine replica is ready yet", "retry_after_s": self._ctl.retry_after_s(5.0)}
        return {"rejected": reason, "retry_after_s": self._ctl.retry_after_s(now=now)}

    def _wake(self) -> None:
        if not self._ctl.queued():
            return
        for session_id, replica_id in self._ctl.drain(time.monotonic()).items():
            future = self._waiters.get(session_id)
            if future is not None and not future.done():
                future.set_result(replica_id)
            elif future is None:
                self._ctl.release(session_id)  # its caller gave up (restart, timeout race)

    def lookup(self, session_id: str) -> str | None:
        """The replica a session is placed on, or None (operators and the restart drill ask this)."""
        try:
            return self._ctl.placement(session_id).replica_id
        except UnknownSessionError:
            return None

    def release(self, session_id: str, context_tokens: int | None = None) -> None:
        self._ctl.release(session_id, context_tokens)
        self._wake()

    def replica_died(self, replica_id: str) -> list[str]:
        """Forget a dead replica; its late reports are ignored until `stale_after_s` has passed."""
        self._closed[replica_id] = time.monotonic()
        return self._ctl.forget_replica(replica_id, time.monotonic())

    def drain(self, replica_id: str, draining: bool = True) -> int:
        """Scale-down: no new sessions go to the replica; returns the sessions still placed there."""
        if draining:
            self._closed[replica_id] = time.monotonic()
        return self._ctl.set_draining(replica_id, draining)

    def note_moves(self, counts: dict) -> None:
        """Add session move outcomes (`MOVE_OUTCOMES`)."""
        for outcome, n in counts.items():
            if outcome in self._moves:
                self._moves[outcome] += int(n)

    def moves(self) -> dict:
        return dict(self._moves)

    def sessions_on(self, replica_id: str) -> int:
        return self._ctl.sessions_on(replica_id)

    def pressure(self) -> dict:
        p = self._ctl.pressure(time.monotonic())
        return {**asdict(p), "used_frac": p.used_frac, "projected_frac": p.projected_frac,
                "budget_frac": p.budget_frac, "seq_frac": p.seq_frac, "load_frac": p.load_frac}

    def replicas(self) -> dict:
        """Live replicas' reports with headroom (O(R): for /v1/cluster and metrics, not a hot path)."""
        live = set(self._ctl.live_replicas(time.monotonic()))
        return {rid: {**asdict(r), "headroom": self._ctl.headroom(rid), "draining": self._ctl.is_draining(rid),
                      "projected_used": self._ctl.projected_used(rid)}
                for rid, r in self._ctl.reports().items() if rid in live}


    def projection_audit(self) -> dict:
        """Live replicas' per-session projected final blocks, with their capacity and block size
        (O(sessions): `bench.admission_accuracy`'s snapshot, not a hot path)."""
        live = self._ctl.live_replicas(time.monotonic())
        reports = self._ctl.reports()
        return {rid: {"kv_blocks_total": reports[rid].kv_blocks_total, "block_size": reports[rid].block_size,
                      "sessions": self._ctl.projections(rid), "sources": self._ctl.source_types(rid)}
                for rid in live}

    def final_sizes(self, session_ids: list[str]) -> dict[str, int]:
        """The context tokens those of `session_ids` that ended recently ended with."""
        return self._ctl.finals.get(session_ids)


def get_or_create_scheduler(config):
    """The one central actor, on the control node (`pipeline.control.home`), created by whoever asks first (ingress or replica).

    Publishes this config's settings and applies them to a running actor; call it again to
    re-resolve the handle (e.g. after the actor was killed for good).
    """
    from ray.experimental.internal_kv import _internal_kv_put

    settings = central_settings(config)
    s = config.scheduler
    _internal_kv_put(_kv_key(s.actor_name), json.dumps(settings).encode(), overwrite=True, namespace=NAMESPACE)
    handle = CentralScheduler.options(
        name=s.actor_name, namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
        num_cpus=config.replicas.scheduler_num_cpus, **control_placement(),
    ).remote(settings["priors"], settings["max_queue"], settings["stale_after_s"], settings["reserve_frac"])
    handle.configure.remote(settings)
    return handle


async def scheduler_health(handle, timeout_s: float = 2.0) -> dict:
    """The cluster pressure, or `SchedulerUnavailable` when the actor does not answer in time."""
    try:
        return await asyncio.wait_for(handle.pressure.remote(), timeout_s)
    except (asyncio.TimeoutError, ray.exceptions.RayError) as e:
        raise SchedulerUnavailable(f"central scheduler unavailable: {type(e).__name__}") from e
