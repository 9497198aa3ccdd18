"""A `/v1/rag` session's retrieval kept on its replica, so that it outlives the ingress driving it.

The replica pulls the retriever's stream into the session in a task of its own and writes each
summary (context, context_skipped, source_error, retrieval_done) into a `ContextLog`; callers tail
the log from a position. The ingress that started the retrieval tails it from 0; if that ingress
dies, the retrieval goes on, and the client's reconnect with `Last-Event-ID` (a context event's id
carries the replica and the log position) lets another ingress tail it from where the client is
(`EngineReplica.stream_context`'s `after`), then ask for the answer: nothing runs twice. A
retrieval nobody tails for `grace_s` (its ingress died and no client took it over) is cancelled;
the session, idle from then on, is aborted once its owner is found gone
(`pipeline.replica.session_owners`). The log ends with the session (abort, answer done, idle TTL).
"""

from __future__ import annotations

import contextvars
from collections.abc import AsyncIterator, Callable

from pipeline.replica.task_log import TaskLog


class ContextLog(TaskLog):
    async def tail(self, after: int = 0) -> AsyncIterator[tuple[str, dict]]:
        """The items after the first `after`, each with its position (1-based) as `pos`."""
        i = after
        with self._watched():
            while True:
                if i < len(self.items):
                    name, data = self.items[i]
                    i += 1
                    yield name, {**data, "pos": i}
                    continue
                if self.done:
                    break
                await self._changed.wait()
            if self.error is not None:
                raise self.error if isinstance(self.error, Exception) else ContextCancelled()


class ContextCancelled(RuntimeError):
    """The retrieval was cancelled (its session was aborted)."""


class ContextLogs:
    """The replica's context logs by session id."""

    def __init__(self, grace_s: float, task_context: Callable[[], contextvars.Context] | None = None):
        """`task_context`: the context each retrieval task runs in (the replica's detaches it from the
        request that started it, whose cancellation Ray would pass on to the retriever calls)."""
        self._grace_s = grace_s
        self._task_context = task_context
        self._logs: dict[str, ContextLog] = {}

    def start_or_get(self, session_id: str, producer_factory) -> ContextLog:
        log = self._logs.get(session_id)
        if log is None:
            context = self._task_context() if self._task_context is not None else None
            log = self._logs[session_id] = ContextLog(producer_factory(), self._grace_s, context)
        return log

    def get(self, session_id: str) -> ContextLog | None:
        return self._logs.get(session_id)

    def end(self, session_id: str) -> None:
        """Forget the session's log, cancelling a retrieval still running."""
        log = self._logs.pop(session_id, None)
        if log is not None and not log.done:
            log.cancel()

    def __len__(self) -> int:
        return len(self._logs)


def outside_the_request() -> contextvars.Context:
    """A fresh context for a retrieval task: not the request's that started it. Ray cancels a
    cancelled task's children (`ray.cancel`'s `recursive`, the parent read from this context), and
    Serve cancels the calls made under a cancelled request's context: a retrieval started by an
    ingress's call must go on when that ingress dies (`pipeline.ingress.cleanup` does the same)."""
    return contextvars.Context()
