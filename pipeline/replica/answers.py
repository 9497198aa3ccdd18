"""Answers kept on the replica that generated them, so that a client (through any ingress) can
resume one after a lost connection without re-running retrieval or generation.

Generation runs in a task owned by the replica and writes coalesced deltas into an `AnswerLog`;
callers tail the log from a token cursor (the tokens they already have). When nobody is tailing
an unfinished answer for `grace_s` (the client left and did not reconnect, or its ingress died and
the client gave up), the generation is cancelled and its KV freed. Finished logs are kept for
`keep_s`, then dropped; a second `finish` of the same session is refused (409), never answered twice.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from pipeline.errors import AnswerDiverged
from pipeline.replica.task_log import TaskLog


@dataclass(frozen=True)
class AnswerPiece:
    """Answer tokens on their way from the replica to the ingress (coalesced over a few ms)."""

    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    tokens: int = 0  # the answer's tokens up to and including this piece: a resume cursor


@dataclass(frozen=True)
class AnswerEnd:
    """The last item of an answer stream: the request's stats (`engine.api.SessionStats` fields,
    `ttft_s`, and for one-shot generations `replica_id`)."""

    stats: dict
    tokens: int = 0


class AnswerLog(TaskLog):
    def __init__(self, producer: AsyncIterator[AnswerPiece | AnswerEnd], grace_s: float):
        self.stats: dict | None = None
        super().__init__(producer, grace_s)

    def _keep(self, item) -> None:
        if isinstance(item, AnswerEnd):
            self.stats = item.stats
        else:
            self.items.append(item)

    async def tail(self, after_tokens: int = 0,
                   expect: list[int] | None = None) -> AsyncIterator[AnswerPiece | AnswerEnd]:
        """Pieces after the first `after_tokens` answer tokens (a straddling piece is cut), then the
        `AnswerEnd`. Each item carries `tokens`: the answer tokens up to and including it. With
        `expect` (the tokens a client already has of an answer regenerated here after its replica
        was lost), the cursor is `len(expect)` and the answer's first tokens are checked against it
        one by one: at the first difference the answer is cancelled and `AnswerDiverged` raised."""
        after_tokens = len(expect) if expect is not None else after_tokens
        with self._watched():
            i, seen = 0, 0
            while True:
                if i < len(self.items):
                    item, i = self.items[i], i + 1
                    ids = item.token_ids
                    if expect is not None and seen < after_tokens:
                        self._check(expect, seen, ids)
                    seen += len(ids)
                    if seen > after_tokens:
                        skip = max(0, len(ids) - (seen - after_tokens))
                        yield dataclasses.replace(item, token_ids=ids[skip:], text=item.text if skip == 0 else "",
                                                  tokens=seen)
                    continue
                if self.done:
                    break
                await self._changed.wait()
            if self.error is not None:
                raise self.error if isinstance(self.error, Exception) else AnswerCancelled()
            if seen < after_tokens and expect is not None:
                raise AnswerDiverged(f"the regenerated answer ended after {seen} tokens; the client already "
                                     f"has {after_tokens}: ask again")
            yield AnswerEnd(self.stats or {}, seen)

    def _check(self, expect: list[int], start: int, ids: list[int]) -> None:
        """`ids`, the answer's tokens from position `start`, against the `expect`ed ones there."""
        for k, (got, sent) in enumerate(zip(ids, expect[start:])):
            if got != sent:
                self._task.cancel()
                raise AnswerDiverged(f"the answer regenerated after its replica was lost differs from the one "
                                     f"being sent at token {start + k} (sent {sent}, regenerated {got}): ask again")


class AnswerCancelled(RuntimeError):
    """The answer was cancelled (nobody tailed it within the grace period, or it was aborted)."""


class AnswerLogs:
    """The replica's answer logs by session id, kept `keep_s` after they end."""

    def __init__(self, grace_s: float, keep_s: float):
        self._grace_s, self._keep_s = grace_s, keep_s
        self._logs: dict[str, AnswerLog] = {}

    def start(self, session_id: str, producer: AsyncIterator[AnswerPiece | AnswerEnd]) -> AnswerLog:
        log = self._logs[session_id] = AnswerLog(producer, self._grace_s)
        return log

    def get(self, session_id: str) -> AnswerLog | None:
        return self._logs.get(session_id)

    def cancel(self, session_id: str) -> bool:
        log = self._logs.get(session_id)
        if log is None or log.done:
            return False
        log.cancel()
        return True

    def expire(self, now: float | None = None) -> int:
        now = time.monotonic() if now is None else now
        old = [s for s, log in self._logs.items() if log.done and now - log.done_at > self._keep_s]
        for s in old:
            del self._logs[s]
        return len(old)

    def __len__(self) -> int:
        return len(self._logs)
