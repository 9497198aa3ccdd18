"""Cluster-wide pressure as the central scheduler sees it: the input of autoscaling and operators."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ClusterPressure:
    """Cluster-wide KV pressure, the input of autoscaling."""

    replicas: int
    kv_blocks_total: int
    kv_blocks_used: int
    kv_blocks_projected: int
    sessions: int
    queued: int
    rejected: int
    kv_blocks_budget: int = 0         # projected blocks admission allows (capacity x overcommit)
    running: int = 0                  # sequences the engines run
    max_num_seqs: int = 0             # their sequence slots (of the replicas that report them)
    waiting: int = 0                  # requests waiting in the engines' queues

    @property
    def used_frac(self) -> float:
        return _share(self.kv_blocks_used, self.kv_blocks_total)

    @property
    def projected_frac(self) -> float:
        return _share(self.kv_blocks_projected, self.kv_blocks_total)

    @property
    def budget_frac(self) -> float:
        """Share of the admission budget the projection takes (1.0: admission stops)."""
        return _share(self.kv_blocks_projected, self.kv_blocks_budget)

    @property
    def seq_frac(self) -> float:
        """Running sequences against the engines' slots."""
        return _share(self.running, self.max_num_seqs)

    @property
    def load_frac(self) -> float:
        """What autoscaling reads: the higher of real KV use and the sequence slots' use (the
        projection is no load yet: when it fills the budget, sessions queue, and the queue counts)."""
        return max(self.used_frac, self.seq_frac)


def _share(part: float, whole: float) -> float:
    """`part` over `whole`, 0 when there is no whole (no replica has reported it yet)."""
    return part / whole if whole else 0.0
