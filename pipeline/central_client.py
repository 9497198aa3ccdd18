"""Caller side of the central scheduler: admissions and releases batched into one actor call.

A Ray actor call costs far more than an admission decision (tens of microseconds), so one
process's concurrent admissions and releases ride the same call: while one batch is in flight the
next accumulates, and goes as soon as the reply comes (no timer: under light load a batch is one
call, under heavy load batches grow and calls per admission shrink). Releases go first in a batch,
so the room they free is there for the admissions after them. An admission the actor cannot place
at once is retried alone with `admit` (the call that waits in the bounded queue), so no batch waits
on a queued session.

A release is posted, not awaited: the caller (a request ending) goes on at once and the release
rides the next batch. A release lost with a failed batch is not retried: the actor drops a
placement that its replica's reports stop listing after its grace period, and a one-shot lease
expires, so a lost release costs headroom for a few seconds, never a leak.
"""

from __future__ import annotations

import asyncio
import logging

import ray

log = logging.getLogger(__name__)


class CentralClient:
    """Batching wrapper of a `CentralScheduler` handle (one per process, used from one event loop)."""

    def __init__(self, handle, max_batch: int = 512):
        self.handle = handle
        self.max_batch = max_batch
        self._admits: list[tuple[dict, asyncio.Future]] = []
        self._releases: list[tuple[str, int | None]] = []
        self._sender: asyncio.Task | None = None
        self.calls = 0

    async def admit(self, session_id: str, source_type: str, timeout_s: float,
                    exclude: list[str] | None = None, **ask) -> dict:
        """Same arguments and result as `CentralScheduler.admit`."""
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

    def _enqueue(self, pending: list, item) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        pending.append((item, future))
        self._start_sender()
        return future

    def _start_sender(self) -> None:
        if self._sender is None or self._sender.done():
            self._sender = asyncio.get_running_loop().create_task(self._send())

    async def _send(self) -> None:
        while self._admits or self._releases:
            releases, self._releases = self._releases[:self.max_batch], self._releases[self.max_batch:]
            admits, self._admits = self._admits[:self.max_batch], self._admits[self.max_batch:]
            try:
                self.calls += 1
                decisions = await self.handle.batch.remote(releases, [a for a, _ in admits])
            except Exception as e:  # every admission in the batch sees the actor's failure
                if releases:
                    log.warning("%d releases lost with a failed batch (%s); reconciliation drops them",
                                len(releases), e)
                for _, future in admits:
                    if not future.done():
                        future.set_exception(e)
                continue
            for (_, future), decision in zip(admits, decisions):
                if not future.done():
                    future.set_result(decision)


async def drain_replica(handle, replica_id: str, timeout_s: float = 5.0) -> int | None:
    """Scale-down of one replica: the central actor places no new session on it from now on.

    Returns the sessions still placed there (None when the actor did not answer in time). Serve
    has already taken the stopping replica out of routing and let its in-flight calls finish
    (within `graceful_shutdown_timeout_s`); a session still open on it moves by replay on its next
    call (`admit(..., recovery=True)` excludes this replica). Call it from the replica's shutdown.
    """
    try:
        return await asyncio.wait_for(handle.drain.remote(replica_id), timeout=timeout_s)
    except (asyncio.TimeoutError, ray.exceptions.RayError):
        return None
