"""Caller side of the central scheduler: admissions and releases batched into one actor call.

A Ray actor call costs far more than an admission decision (tens of microseconds), so one
process's concurrent admissions and releases ride the same call: while one batch is in flight the
next accumulates, and goes as soon as the reply comes (no timer: under light load a batch is one
call, under heavy load batches grow and calls per admission shrink). Releases go first in a batch,
so the room they free is there for the admissions after them. An admission the actor cannot place
at once is retried alone with `admit` (the call that waits in the bounded queue), so no batch waits
on a queued session.

Admission slots (`scheduler.admission_slots`): the actor may hand this process a few placements
decided ahead, per source type. A plain admission (no exclusion, no size, no lease) takes one
locally and returns at once; the binding (which session took it) is posted and rides the next
batch. Each batch tops up the stock of every type admitted since the previous batch went, to as
many as were admitted in the last slot-use window (at most `slots`): an admission finds one ready
while the load keeps up, the headroom held ahead follows the rate, and a type nobody admits gets
none. Slots on a replica that began draining or died are dropped with the next reply, and every
slot goes back when a reply says sessions wait in the actor's queue (a slot would let a new session
pass them, recoveries included). A slot is used only within half of its lease, counted from when it
was asked for, so its binding reaches the actor in time (a late one still places the session where
it went).

A release is posted, not awaited: the caller (a request ending) goes on at once and the release
rides the next batch. A release lost with a failed batch is not retried: the actor drops a
placement that its replica's reports stop listing after its grace period, and a one-shot lease
expires, so a lost release costs headroom for a few seconds, never a leak.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import deque

import ray

log = logging.getLogger(__name__)


class CentralClient:
    """Batching wrapper of a `CentralScheduler` handle (one per process, used from one event loop)."""

    def __init__(self, handle, max_batch: int = 512, slots: int = 0):
        self.handle = handle
        self.max_batch = max_batch
        self.max_slots = slots
        self.holder = uuid.uuid4().hex[:12]
        self._admits: list[tuple[dict, asyncio.Future]] = []
        self._releases: list[tuple[str, int | None]] = []
        self._binds: list[tuple[str, str, str, str]] = []
        self._slots: dict[str, deque[tuple[str, str, float]]] = {}  # type -> (slot, replica, use before)
        self._admitted: set[str] = set()  # source types admitted since the last batch went
        self._recent: dict[str, deque[float]] = {}  # type -> times of its latest admissions
        self._use_window_s = 1.0                    # half the actor's slot lease, learned from replies
        self._sender: asyncio.Task | None = None
        self.calls = 0          # actor calls made (batches)
        self.from_slots = 0     # admissions decided here, from a slot
        self.through_actor = 0  # admissions the actor decided

    async def admit(self, session_id: str, source_type: str, timeout_s: float,
                    exclude: list[str] | None = None, **ask) -> dict:
        """Same arguments and result as `CentralScheduler.admit`."""
        if self.max_slots and not exclude and not any(ask.values()):
            replica_id = self._take_slot(session_id, source_type)
            if replica_id is not None:
                return {"replica_id": replica_id}
        self.through_actor += 1
        item = {"session_id": session_id, "source_type": source_type, "exclude": list(exclude or ()), **ask}
        decision = await self._enqueue(self._admits, item)
        if decision is None:  # no room right now: wait in the actor's queue
            decision = await self.handle.admit.remote(session_id, source_type, timeout_s, exclude, **ask)
        return decision

    async def admit_request(self, request_id: str, tokens: int, timeout_s: float) -> dict:
        return await self.handle.admit_request.remote(request_id, tokens, timeout_s)

    def release(self, session_id: str, context_tokens: int | None = None) -> None:
        """Post a release (see the module docstring); call it from the client's event loop."""
        self._releases.append((session_id, context_tokens))
        self._start_sender()

    async def flush(self) -> None:
        """Wait until everything posted so far has reached the actor (tests, shutdown)."""
        while self._sender is not None and not self._sender.done():
            await asyncio.shield(self._sender)

    def _take_slot(self, session_id: str, source_type: str) -> str | None:
        self._admitted.add(source_type)
        self._recent.setdefault(source_type, deque(maxlen=self.max_slots)).append(time.monotonic())
        self._give_back_slots()
        held = self._slots.get(source_type)
        if not held:
            return None
        slot_id, replica_id, _ = held.popleft()
        self._binds.append((slot_id, session_id, replica_id, source_type))
        self.from_slots += 1
        self._start_sender()
        return replica_id

    def replica_died(self, replica_id: str) -> None:
        """Hand out no more slots on a replica found dead or draining (the actor says so in each
        batch's reply, this process when a call finds it dead)."""
        for source_type, held in self._slots.items():
            self._slots[source_type] = deque(slot for slot in held if slot[1] != replica_id)

    def _give_back_slots(self, every: bool = False) -> None:
        """Give back the slots too old to trust, or `every` one (their room goes back with the next
        batch)."""
        now = time.monotonic()
        for held in self._slots.values():
            while held and (every or held[0][2] < now):
                self._releases.append((held.popleft()[0], None))

    def _want(self) -> dict[str, int]:
        want, since = {}, time.monotonic() - self._use_window_s
        for source_type in self._admitted:
            recent = self._recent[source_type]
            while recent and recent[0] < since:
                recent.popleft()
            missing = len(recent) - len(self._slots.get(source_type, ()))
            if missing > 0:
                want[source_type] = missing
        self._admitted.clear()
        return want

    def _keep_slots(self, granted: dict, slot_s: float, sent_at: float) -> None:
        self._use_window_s = slot_s / 2
        use_before = sent_at + self._use_window_s
        for source_type, slots in granted.items():
            held = self._slots.setdefault(source_type, deque())
            held.extend((slot_id, replica_id, use_before) for slot_id, replica_id in slots)

    def _enqueue(self, pending: list, item) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        pending.append((item, future))
        self._start_sender()
        return future

    def _start_sender(self) -> None:
        if self._sender is None or self._sender.done():
            self._sender = asyncio.get_running_loop().create_task(self._send())

    async def _send(self) -> None:
        while self._admits or self._releases or self._binds:
            releases, self._releases = self._releases[:self.max_batch], self._releases[self.max_batch:]
            admits, self._admits = self._admits[:self.max_batch], self._admits[self.max_batch:]
            binds, self._binds = self._binds, []
            self._give_back_slots()
            want = self._want() if self.max_slots else {}
            sent_at = time.monotonic()
            try:
                self.calls += 1
                reply = await self.handle.batch.remote(releases, [a for a, _ in admits], binds, want, self.holder)
            except Exception as e:  # every admission in the batch sees the actor's failure
                if releases or binds:
                    log.warning("%d releases and %d slot bindings lost with a failed batch (%s); "
                                "reconciliation mends them", len(releases), len(binds), e)
                for _, future in admits:
                    if not future.done():
                        future.set_exception(e)
                continue
            self._keep_slots(reply["slots"], reply["slot_s"], sent_at)
            if reply.get("queued"):
                self._give_back_slots(every=True)
            for replica_id in reply["closed"]:
                self.replica_died(replica_id)
            for (_, future), decision in zip(admits, reply["decisions"]):
                if not future.done():
                    future.set_result(decision)


async def drain_replica(handle, replica_id: str, timeout_s: float = 5.0) -> int | None:
    """Scale-down of one replica: the central actor places no new session on it from now on.

    Returns the sessions still placed there (None when the actor did not answer in time). Serve
    has already taken the stopping replica out of routing and let its in-flight calls finish
    (within `graceful_shutdown_timeout_s`); the replica then moves its open sessions elsewhere
    (`pipeline.replica.drain`; `admit(..., recovery=True)` excludes this replica). Call it from the
    replica's shutdown.
    """
    try:
        return await asyncio.wait_for(handle.drain.remote(replica_id), timeout=timeout_s)
    except (asyncio.TimeoutError, ray.exceptions.RayError):
        return None
