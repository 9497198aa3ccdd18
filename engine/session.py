"""Session bookkeeping and input checks. No vLLM here: this is the state the engine guards."""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.api import InvalidInputError, SessionStats


class SessionState(enum.Enum):
    OPEN = "open"
    FINISHING = "finishing"
    CLOSED = "closed"


@dataclass
class Session:
    session_id: str
    stats: SessionStats
    context: list[int] = field(default_factory=list)
    state: SessionState = SessionState.OPEN
    request: Any = None  # the live engine request holding this session's KV, if any
    opened_at: float = field(default_factory=time.time)  # wall clock, as vLLM stamps arrivals
    # Requests superseded by a replace or a seeded question, kept until their replacement has run
    # once so that it shares their prefix blocks instead of recomputing them (then closed).
    retiring: dict = field(default_factory=dict)  # replaced request -> task that closes it


class AnswerStream:
    """The answer of a finished session, as an async iterator that ends the session however its
    reader leaves: at the end, by `aclose()`, or by dropping it. An async generator dropped before
    its first step never runs its `finally`, so a reader that went away without reading would
    otherwise leave the session decoding, then finishing, forever."""

    def __init__(self, answer: AsyncIterator, close_unread: Callable[[], Awaitable[None]]):
        self._answer = answer  # an async generator whose `finally` closes the session
        self._close_unread = close_unread
        self._started = False
        self._loop = asyncio.get_running_loop()

    def __aiter__(self) -> "AnswerStream":
        return self

    async def __anext__(self):
        self._started = True
        return await self._answer.__anext__()

    async def aclose(self) -> None:
        if not self._started:
            self._started = True
            await self._close_unread()
        await self._answer.aclose()

    def __del__(self):
        # Garbage collection may run on any thread: hand the close to the session's loop.
        if not self._started and not self._loop.is_closed():
            self._started = True
            self._loop.call_soon_threadsafe(self._loop.create_task, self._close_unread())


def longest_common_prefix(old: Sequence[int], new: Sequence[int]) -> int:
    limit = min(len(old), len(new))
    for index in range(limit):
        if old[index] != new[index]:
            return index
    return limit


def check_text(text: str | bytes) -> str:
    """Text must be valid UTF-8: bytes are decoded strictly; str may not hold lone surrogates."""
    if isinstance(text, bytes):
        try:
            return text.decode("utf-8")
        except UnicodeDecodeError as error:
            raise InvalidInputError(f"text is not valid UTF-8: {error}") from None
    if not isinstance(text, str):
        raise InvalidInputError(f"text must be str or bytes, not {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise InvalidInputError(f"text is not valid UTF-8: {error}") from None
    return text


def check_token_ids(token_ids: Sequence[int], vocab_size: int) -> list[int]:
    ids = list(token_ids)
    bad = [t for t in ids if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab_size]
    if bad:
        raise InvalidInputError(f"token ids must be ints in [0, {vocab_size}); got {bad[:5]}")
    return ids


class IncrementalDetokenizer:
    """Turns answer token ids into text deltas; holds back a trailing partial UTF-8 character."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._emitted = ""

    def push(self, token_ids: Sequence[int], final: bool = False) -> str:
        self._ids.extend(token_ids)
        text = self._tokenizer.decode(self._ids, skip_special_tokens=True)
        if text.endswith("\ufffd") and not final:
            return ""
        delta = text[len(self._emitted):] if text.startswith(self._emitted) else text
        self._emitted = text
        return delta
