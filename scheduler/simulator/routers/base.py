"""What a cluster router sees of the simulated replicas, and what it must answer.

A router places a session (its first chunk) on a replica, or answers None: the session waits and
the router hands it out later from `admitted` (only the central router queues). It hears when a
session finishes and, if it wants reports (`report_interval_s`), gets each replica's report at
that interval: between reports it sees only what the last one said (stale on purpose).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class SessionAsk:
    session_id: str
    source_type: str


class ReplicaSide(Protocol):
    """The live facts a replica has; routers other than the central one read only `num_active`
    (ongoing requests), and only when the modelled router would learn it (a probe, a response)."""

    @property
    def num_active(self) -> int: ...


class Router(Protocol):
    name: str
    report_interval_s: float | None  # None: no reports wanted

    def bind(self, replicas: Sequence[ReplicaSide], now: float) -> None: ...

    def place(self, ask: SessionAsk, now: float) -> int | None: ...

    def on_finish(self, session_id: str, replica: int, context_tokens: int, now: float) -> None: ...

    def on_report(self, replica: int, now: float) -> None: ...

    def admitted(self, now: float) -> list[tuple[str, int]]: ...


class Stateless:
    """Defaults for routers that keep no queue and want no reports."""

    report_interval_s: float | None = None

    def bind(self, replicas: Sequence[ReplicaSide], now: float) -> None:
        self.replicas = replicas

    def on_finish(self, session_id: str, replica: int, context_tokens: int, now: float) -> None:
        return None

    def on_report(self, replica: int, now: float) -> None:
        return None

    def admitted(self, now: float) -> list[tuple[str, int]]:
        return []
