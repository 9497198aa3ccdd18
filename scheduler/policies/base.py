"""The policy interface: a total order over requests; ascending = higher priority.

Phase 1 of the planner walks this order to choose who computes and who keeps memory; phase 2 takes
eviction victims from its tail. A key must depend only on the view (not on the clock), so that an
owner can keep the order incrementally (`PolicyQueue`) and re-key only the requests that changed.
Every key ends with `view.seq`, which makes the order total and deterministic.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import ClassVar

from scheduler.request import RequestView


class Policy(ABC):
    name: ClassVar[str]
    # True: a partial stream evicted by the planner stops streaming: its later chunks are only
    # queued, and it runs again as a one-shot request once its question arrives (`blocked`).
    degrade_evicted_streams: ClassVar[bool] = False
    # Share of a step's token budget that partial streams' early prefill may take while a completed
    # prompt has work in the step (`StepBudget.early_prefill_tokens`); None: no limit.
    early_prefill_share: ClassVar[float | None] = None

    def early_prefill_tokens(self, max_num_tokens: int) -> int | None:
        """The planner's early-prefill limit for a step budget of `max_num_tokens` tokens."""
        share = self.early_prefill_share
        return None if share is None else max(1, int(max_num_tokens * share))

    @abstractmethod
    def sort_key(self, view: RequestView) -> tuple:
        """Smaller key = higher priority."""

    def order(self, views: Iterable[RequestView]) -> list[RequestView]:
        return sorted(views, key=self.sort_key)


def has_no_work(view: RequestView) -> int:
    """1 for requests with nothing left to compute (idle partial streams): they sort last."""
    return 0 if view.num_tokens_to_compute else 1
