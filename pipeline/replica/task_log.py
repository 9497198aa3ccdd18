"""A log that a producer task writes on the replica and any number of readers tail: the shape of
both an answer (`pipeline.replica.answers`) and a `/v1/rag` retrieval
(`pipeline.replica.context_log`), each of which outlives the call that started it. Once the last
reader leaves before the task ends, the task is cancelled after `grace_s` unless a reader returns
(a client resuming, another ingress taking the session over)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections.abc import AsyncIterator


class TaskLog:
    def __init__(self, producer: AsyncIterator, grace_s: float, context: contextvars.Context | None = None):
        self.items: list = []
        self.error: BaseException | None = None
        self.done_at: float | None = None
        self._grace_s = grace_s
        self._watchers = 0
        self._changed = asyncio.Event()
        self._reaper: asyncio.Task | None = None
        self._task = asyncio.get_running_loop().create_task(self._run(producer), context=context)

    @property
    def done(self) -> bool:
        return self.done_at is not None

    def _keep(self, item) -> None:
        self.items.append(item)

    async def _run(self, producer) -> None:
        try:
            async for item in producer:
                self._keep(item)
                self._notify()
        except BaseException as e:  # cancellation included: tails must not wait forever
            self.error = e
            if not isinstance(e, Exception):
                raise
        finally:
            self.done_at = time.monotonic()
            self._notify()

    def _notify(self) -> None:
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    @contextlib.contextmanager
    def _watched(self):
        """Held by a tail while it reads; the last one out starts the grace period."""
        self._watchers += 1
        try:
            yield
        finally:
            self._watchers -= 1
            if self._watchers == 0 and not self.done:
                self._reaper = asyncio.get_running_loop().create_task(self._reap())

    async def _reap(self) -> None:
        await asyncio.sleep(self._grace_s)
        if self._watchers == 0 and not self.done:
            self._task.cancel()

    def cancel(self) -> None:
        self._task.cancel()
