"""Caller side of the central scheduler: admissions and releases batched into one actor call.

A Ray actor call costs far more than an admission decision (tens of microseconds), so one
process's concurrent admissions and releases ride the same call: while one batch is in flight the
next accumulates, and goes as soon as the reply comes (no timer: under light load a batch is one
call, under heavy load batches grow and calls per admission shrink). Releases go first in a batch,
so the room they free is there for the admissions after them. An admission the actor cannot place
at once is retried alone with `admit` (the call that waits in the bounded queue), so no batch waits
on a queued session.
"""

from __future__ import annotations

import asyncio

import ray


class CentralClient:
    """Batching wrapper of a `CentralScheduler` handle (one per process, used from one event loop)."""

    def __init__(self, handle, max_batch: int = 512):
        self.handle = handle
        self.max_batch = max_batch
        self._admits: list[tuple[dict, asyncio.Future]] = []
        self._releases: list[tuple[tuple, asyncio.Future]] = []
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

    async def release(self, session_id: str, context_tokens: int | None = None) -> None:
        await self._enqueue(self._releases, (session_id, context_tokens))

    def _enqueue(self, pending: list, item) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        pending.append((item, future))
        if self._sender is None or self._sender.done():
            self._sender = asyncio.get_running_loop().create_task(self._send())
        return future

    async def _send(self) -> None:
        while self._admits or self._releases:
            releases, self._releases = self._releases[:self.max_batch], self._releases[self.max_batch:]
            admits, self._admits = self._admits[:self.max_batch], self._admits[self.max_batch:]
            try:
                self.calls += 1
                decisions = await self.handle.batch.remote([r for r, _ in releases], [a for a, _ in admits])
            except Exception as e:  # every caller in the batch sees the actor's failure
                for _, future in releases + admits:
                    if not future.done():
                        future.set_exception(e)
                continue
            for _, future in releases:
                if not future.done():
                    future.set_result(None)
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
