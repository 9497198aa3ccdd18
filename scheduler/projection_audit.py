"""How far the central scheduler's projection is from what the sessions really held.

The scheduler projects each placement's final size (`Placement.reserved_blocks`: a session's
learned percentile size, a one-shot request's lease) and admits against the sum. The audit takes
a snapshot of those projections per replica at some moment, and later compares it with the sizes
the same sessions really reached when they ended (their release's context tokens, kept in
`FinalSizes`): per replica, |projected - real| over the sessions whose final size is known, as a
fraction of the replica's KV capacity. Sessions that ended without a size (aborted, failed, still
open) are left out of both sides and counted.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass, field


class FinalSizes:
    """The context tokens the last `limit` sessions ended with, by session id."""

    def __init__(self, limit: int = 16384):
        self.limit = limit
        self._sizes: OrderedDict[str, int] = OrderedDict()

    def add(self, session_id: str, tokens: int) -> None:
        self._sizes[session_id] = tokens
        if len(self._sizes) > self.limit:
            self._sizes.popitem(last=False)

    def get(self, session_ids) -> dict[str, int]:
        return {sid: self._sizes[sid] for sid in session_ids if sid in self._sizes}


@dataclass(frozen=True)
class AuditPoint:
    """One replica at one moment: projected and real final blocks of its sessions with a known end."""

    projected_blocks: int
    real_blocks: int
    capacity_blocks: int
    sessions: int           # compared
    unresolved: int         # left out: no final size known
    excess_by_source: dict[str, int] = field(default_factory=dict)  # projected - real blocks, per source type

    @property
    def error(self) -> float:
        return abs(self.projected_blocks - self.real_blocks) / self.capacity_blocks


def audit_point(projections: dict[str, int], finals: dict[str, int], capacity_blocks: int,
                block_size: int, sources: dict[str, str] | None = None) -> AuditPoint:
    """`projections`: session -> projected final blocks at the snapshot; `finals`: session -> the
    context tokens it ended with (`FinalSizes.get`); `sources`: session -> source type, to say which
    sessions the error comes from."""
    known = [sid for sid in projections if sid in finals]
    real = {sid: -(-finals[sid] // block_size) for sid in known}
    excess: Counter[str] = Counter()
    for sid in known:
        excess[(sources or {}).get(sid, "")] += projections[sid] - real[sid]
    return AuditPoint(sum(projections[sid] for sid in known), sum(real.values()), capacity_blocks, len(known),
                      len(projections) - len(known), dict(excess))
