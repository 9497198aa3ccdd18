"""Streaming-input session records outside the ingress, so that any ingress replica serves any
session and an ingress death loses nothing.

Records live in `SessionShard` actors (detached, named, on the head node like the central
scheduler; each started by the first session it holds, so OpenAI-only traffic runs none); a
session's shard is chosen by a hash of its id, so the load spreads over the shards and no actor
sees every chunk of the cluster. A record holds what recovery needs: the replica,
the client's context changes in order (text; replayed on another replica if the replica dies), the
citations, the last client sequence number and, once the answer started, the finished mark (a
second finish is refused). Records idle past the session TTL are dropped, as the replicas drop
their sessions. Every change is journaled on the shard's node before the call returns
(`pipeline.sessions.journal`), and Ray restarts a dead shard, which reloads its journal: a shard's
death loses no session.

A change with a client `seq` is claimed, applied on the replica, then committed: the commit logs
the change and raises the session's last sequence number in one step, so a claim alone never makes
a retry a duplicate. While an ingress holds a claim, a retry of the same `seq` (through any
ingress) is refused (409: being applied); once the holder's actor is gone (it died between claim
and commit), the next claim takes it over and applies the change: no hole (a replica that prefilled
it already does not do it twice: `EngineReplica.change_context`'s `seq`). Claims
live in the shard's memory only (a restarted shard forgets them, which is what a dead holder's
claim amounts to).

A session moves to another replica (scale-down: `pipeline.replica.drain`; a lost replica: the
ingress's recovery) under the shard's move mark (`begin_move` .. `end_move`): one mover at a time,
and every read of the session waits for the move to end (`MOVE_WAIT_S` at most), so a client's next
call finds the record pointing at where its context now is.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time

import ray

from pipeline.control.central import NAMESPACE
from pipeline.control.home import control_placement
from pipeline.control.liveness import serve_actor_alive
from pipeline.errors import SessionConflict, SessionGone
from pipeline.sessions.journal import SessionJournal, apply_change
from pipeline.sessions.log import SessionLog

logger = logging.getLogger(__name__)
_GONE = object()
MOVE_WAIT_S = 60.0  # a move not ended by then is taken for its mover's death: readers go on
FIELDS = ("session_id", "source_type", "replica_id", "node_id", "context_tokens", "recovered",
          "last_seq", "created_at")


def _record(log: SessionLog) -> dict:
    return {k: getattr(log, k) for k in FIELDS} | {"ops": list(log.ops), "sources": list(log.sources)}


@ray.remote(max_restarts=-1, max_task_retries=3)
class SessionShard:
    def __init__(self, name: str, ttl_s: float):
        self._journal = SessionJournal.for_shard(name, ray.get_runtime_context().get_node_id())
        self._ttl_s = self._journal.setting("ttl_s", ttl_s)  # a redeploy's, if one configured it
        self._configured_at = self._journal.setting("configured_at", 0.0)
        loaded, now = self._journal.load(self._ttl_s), time.monotonic()
        self._records: dict[str, dict] = loaded.records
        self._touched: dict[str, float] = {sid: now - idle for sid, idle in loaded.idle_s.items()}
        self._finished: dict[str, float] = {sid: now - ago for sid, ago in loaded.finished_ago_s.items()}
        self._sweeper: asyncio.Task | None = None
        self._claims: dict[str, dict[int, str | None]] = {}  # session -> uncommitted seq -> claiming ingress
        self._moving: dict[str, tuple[asyncio.Event, float]] = {}  # session -> (move ended, began at)

    def _start_sweeper(self) -> None:
        if self._sweeper is None:  # started from a call: the actor's event loop runs it
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    async def create(self, record: dict) -> None:
        self._start_sweeper()
        self._journal.created(record)
        self._records[record["session_id"]] = record
        self._touched[record["session_id"]] = time.monotonic()

    def configure(self, ttl_s: float, issued_at: float) -> None:
        """The idle TTL of the deployment now running: a detached shard outlives the deployment
        that created it, and keeps its constructor's arguments across redeploys (and restarts,
        hence the journal). Calls from different ingress replicas arrive in no set order: the one
        issued last (wall clock) wins."""
        if issued_at < self._configured_at:
            return
        self._journal.set_setting("ttl_s", ttl_s)
        self._journal.set_setting("configured_at", issued_at)
        self._ttl_s, self._configured_at = ttl_s, issued_at

    async def get(self, session_id: str, claim_seq: int | None = None, claimer: str | None = None) -> dict:
        """The record (ops included); `{"finished": true}` once it was finished; `{}` if unknown.

        `claim_seq`: a client change that `claimer` (an ingress actor's name) is about to apply. Not
        above the last committed one, or below a live claim: `duplicate` (a retry: no-op). Equal to
        a live claim: `busy` (being applied). Else the claim is taken."""
        self._start_sweeper()  # a restarted shard's first call may be a read of its reloaded records
        await self._settled(session_id)
        if session_id in self._finished:
            return {"finished": True}
        record = self._records.get(session_id)
        if record is None:
            return {}
        # A read is no activity (polling must not keep a session alive); commits are.
        if claim_seq is None:
            return record
        if claim_seq <= record["last_seq"]:
            return {**record, "duplicate": True}
        refused = await self._claim(session_id, claim_seq, claimer)
        return {**record, refused: True} if refused else record

    async def _claim(self, session_id: str, seq: int, claimer: str | None) -> str | None:
        """Take the claim of `seq`; else "busy" (a live holder of the same seq) or "duplicate" (a
        live holder of a later one). A dead holder's claim is dropped; one without a holder's name
        (a caller outside Serve) guards nothing. The holders of `seq` and later are asked, rarely more
        than one: a session's changes come one after another."""
        claims = self._claims.setdefault(session_id, {})
        for held in sorted((s for s in claims if s >= seq), reverse=True):
            holder = claims.get(held, _GONE)
            if holder is _GONE or holder is None:
                continue
            if holder == claimer or await serve_actor_alive(holder):
                return "busy" if held == seq else "duplicate"
            if claims.get(held, _GONE) == holder:  # not changed while we asked
                logger.warning("session %s: ingress %s died between claiming change %d and committing it; "
                               "the claim is taken over", session_id, holder, held)
                del claims[held]
        claims[seq] = claimer
        return None

    def unclaim(self, session_id: str, claim_seq: int) -> None:
        """A claimed change failed: the claim goes, nothing was recorded."""
        self._claims.get(session_id, {}).pop(claim_seq, None)

    def commit(self, session_id: str, op: tuple | None, sources: list[dict] | None, fields: dict) -> bool:
        """Record an accepted change: `op` (a `ContextOp`, text) is logged, `sources` are the
        change's citations (a replace resets them), `fields` overwrite. False if the record is gone."""
        record = self._records.get(session_id)
        if record is None:
            return False
        if "last_seq" in fields:  # never lowered by a change with an older seq committing later
            fields = {**fields, "last_seq": max(fields["last_seq"], record["last_seq"])}
            claims = self._claims.get(session_id, {})
            for seq in [s for s in claims if s <= fields["last_seq"]]:
                del claims[seq]
        self._journal.changed(session_id, op, sources, fields, touches=True)
        apply_change(record, op, sources, fields)
        self._touched[session_id] = time.monotonic()
        return True

    async def finish(self, session_id: str) -> dict:
        """Mark finished (atomic: exactly one caller gets the record); `{}` if unknown, `{"finished":
        true}` if it was finished already."""
        await self._settled(session_id)
        if session_id in self._finished:
            return {"finished": True}
        record = self._records.pop(session_id, None)
        self._touched.pop(session_id, None)
        self._claims.pop(session_id, None)
        if record is None:
            return {}
        self._journal.finished(session_id)
        self._finished[session_id] = time.monotonic()
        return record

    async def begin_move(self, session_id: str, from_replica: str, yield_to_changes: bool = False) -> dict:
        """Take the move mark of a session held by `from_replica`: the record, or `{}` when it is not
        there (unknown, finished, already moved, being moved) or, with `yield_to_changes`, while a
        client change is being applied (its ingress recovers the session itself)."""
        await self._settled(session_id)
        record = self._records.get(session_id)
        if record is None or record["replica_id"] != from_replica or session_id in self._moving:
            return {}
        if yield_to_changes and self._claims.get(session_id):
            return {}
        self._moving[session_id] = (asyncio.Event(), time.monotonic())
        return record

    def end_move(self, session_id: str, fields: dict | None) -> bool:
        """End a move: `fields` (the new replica, node and context size) are recorded, None when the
        move failed (the record stays as it was). False if the record went meanwhile."""
        ended, _ = self._moving.pop(session_id, (None, 0.0))
        record = self._records.get(session_id)
        if fields and record is not None:
            self._journal.changed(session_id, None, None, fields, touches=False)
            apply_change(record, None, None, fields)
        if ended is not None:
            ended.set()
        return record is not None

    async def _settled(self, session_id: str) -> None:
        """Wait for a move of the session to end; one older than MOVE_WAIT_S is dropped (its mover died)."""
        moving = self._moving.get(session_id)
        if moving is None:
            return
        ended, began = moving
        try:
            await asyncio.wait_for(ended.wait(), max(0.0, MOVE_WAIT_S - (time.monotonic() - began)))
        except asyncio.TimeoutError:
            if self._moving.get(session_id) is moving:
                logger.warning("session %s: its move did not end within %.0f s; going on", session_id, MOVE_WAIT_S)
                del self._moving[session_id]

    async def drop(self, session_id: str) -> bool:
        await self._settled(session_id)
        return self._drop(session_id)

    def _drop(self, session_id: str) -> bool:
        self._touched.pop(session_id, None)
        self._claims.pop(session_id, None)
        if self._records.pop(session_id, None) is None:
            return False
        self._journal.dropped(session_id)
        return True

    def count(self) -> int:
        return len(self._records)

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self._ttl_s / 4))
            now = time.monotonic()
            for sid in [s for s, t in self._touched.items() if now - t > self._ttl_s]:
                self._drop(sid)
            for sid in [s for s, t in self._finished.items() if now - t > self._ttl_s]:
                self._journal.unfinished(sid)
                del self._finished[sid]


def shard_name(scheduler_name: str, index: int) -> str:
    return f"{scheduler_name}_sessions_{index}"


def _existing(name: str):
    """The named shard's handle, or None when nobody has started it."""
    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return None


def shard_index(session_id: str, shards: int) -> int:
    """Which of `shards` shards holds the session's record: a hash of its id."""
    digest = hashlib.blake2b(session_id.encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") % shards


class SessionStore:
    """The ingress's view of the shards: async calls, `SessionLog`s in and out."""

    def __init__(self, config, owner: str | None = None):
        """`owner`: this ingress replica's actor name (what the shards ask about a claim it holds).
        A shard starts with the first session it holds: a deployment that serves no streaming-input
        session (OpenAI routes only) runs none. Shards that already exist (a redeploy's) are adopted
        now, so the redeploy's TTL reaches them at once."""
        self._owner = owner
        self._names = [shard_name(config.scheduler.actor_name, i) for i in range(config.ingress.session_shards)]
        self._ttl_s, self._issued_at = config.limits.session_ttl_s, time.time()
        self._placement = control_placement()
        self._handles: dict[int, ray.actor.ActorHandle] = {}
        for index in range(len(self._names)):
            self._find(index)
        self.max_chunks = config.limits.max_chunks_per_session

    def _adopt(self, index: int, shard):
        """Use `shard` (None: not started) as shard `index`; its TTL set to this deployment's."""
        if shard is not None:
            # configure calls from ingress replicas arrive in no set order: the latest issued wins
            shard.configure.remote(self._ttl_s, self._issued_at)
            self._handles[index] = shard
        return shard

    def _start(self, index: int):
        name = self._names[index]
        return self._adopt(index, SessionShard.options(name=name, namespace=NAMESPACE, lifetime="detached",
                                                       get_if_exists=True, num_cpus=0, **self._placement
                                                       ).remote(name, self._ttl_s))

    async def _call(self, session_id: str, method: str, *args, absent=None, start: bool = False):
        """`method` of the session's shard; `absent` when that shard has not started (it holds no
        session), unless `start` (a new session) starts it."""
        index = shard_index(session_id, len(self._names))
        shard = self._handles.get(index)
        if shard is None:  # a GCS round trip, until the shard is known here: off the event loop
            shard = await asyncio.to_thread(self._start if start else self._find, index)
            if shard is None:
                return absent
        return await getattr(shard, method).remote(*args)

    def _find(self, index: int):
        return self._adopt(index, _existing(self._names[index]))

    def started_shards(self) -> list:
        """The shards this store has started or found so far."""
        return [self._handles[i] for i in sorted(self._handles)]

    async def add(self, log: SessionLog) -> None:
        await self._call(log.session_id, "create", _record(log), start=True)

    async def get(self, session_id: str, claim_seq: int | None = None,
                  for_change: bool = True) -> tuple[SessionLog, bool]:
        """The session and whether `claim_seq` marks a duplicate change (see `SessionShard.get`).
        A finished session, or the same change being applied through another ingress: 409 for a
        change (`for_change`); a finished one is else 404 like any closed session."""
        record = await self._call(session_id, "get", session_id, claim_seq, self._owner, absent={})
        if record.get("busy"):
            raise SessionConflict(f"change seq {claim_seq} of session {session_id} is being applied through "
                                  "another ingress; retry it to learn whether it was (duplicate: true)")
        if record.get("finished") and for_change:
            raise _finished(session_id)
        if not record or record.get("finished"):
            raise SessionGone(f"session {session_id!r} is unknown, finished, deleted or expired")
        return _log(record), bool(record.get("duplicate"))

    async def unclaim(self, log: SessionLog, claim_seq: int) -> None:
        await self._call(log.session_id, "unclaim", log.session_id, claim_seq)

    async def commit(self, log: SessionLog, op: tuple | None = None, sources: list[dict] | None = None) -> None:
        fields = {k: getattr(log, k) for k in ("replica_id", "node_id", "context_tokens", "recovered", "last_seq")}
        if not await self._call(log.session_id, "commit", log.session_id, op, sources, fields, absent=False):
            raise SessionGone(f"session {log.session_id!r} expired or was deleted meanwhile")

    async def finish(self, session_id: str) -> SessionLog:
        record = await self._call(session_id, "finish", session_id, absent={})
        if record.get("finished"):
            raise _finished(session_id)
        if not record:
            raise SessionGone(f"session {session_id!r} is unknown, finished, deleted or expired")
        return _log(record)

    async def drop(self, session_id: str) -> bool:
        return await self._call(session_id, "drop", session_id, absent=False)

    async def begin_move(self, session_id: str, from_replica: str, yield_to_changes: bool = False) -> SessionLog | None:
        """The session, marked moving, when `from_replica` holds it (see `SessionShard.begin_move`)."""
        record = await self._call(session_id, "begin_move", session_id, from_replica, yield_to_changes)
        return _log(record) if record else None

    async def end_move(self, log: SessionLog | None, session_id: str = "") -> bool:
        """End the move: `log` holds where the session is now; None (with `session_id`): it failed."""
        sid = log.session_id if log is not None else session_id
        fields = None if log is None else {k: getattr(log, k) for k in ("replica_id", "node_id", "context_tokens",
                                                                          "recovered")}
        return await self._call(sid, "end_move", sid, fields, absent=False)

    async def count(self) -> int:
        """Records over every shard; one not started (here or by another process) holds none."""
        missing = [i for i in range(len(self._names)) if i not in self._handles]
        if missing:
            await asyncio.to_thread(lambda: [self._find(i) for i in missing])
        return sum(await asyncio.gather(*(s.count.remote() for s in self.started_shards())))

    def check_chunk_room(self, log: SessionLog) -> None:
        from pipeline.errors import LimitExceeded

        if log.chunks >= self.max_chunks:
            raise LimitExceeded(f"session {log.session_id} already has {log.chunks} chunks (limit {self.max_chunks})")


def _finished(session_id: str) -> SessionConflict:
    return SessionConflict(f"session {session_id} was already finished; reconnect with Last-Event-ID to get "
                           "the rest of its answer")


def _log(record: dict) -> SessionLog:
    log = SessionLog(**{k: record[k] for k in FIELDS})
    log.ops, log.sources = [tuple(op) for op in record["ops"]], list(record["sources"])
    return log
