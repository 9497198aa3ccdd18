"""A vLLM stat logger that keeps the latest KV usage and preemption counts for the engine's stats()."""

from __future__ import annotations

from dataclasses import dataclass

from vllm.v1.metrics.loggers import StatLoggerBase


@dataclass
class KvSnapshot:
    usage: float = 0.0
    num_running: int = 0
    num_waiting: int = 0
    preemptions: int = 0  # vLLM's own preemptions plus idle sessions evicted by our scheduler
    steps: int = 0
    peak_usage: float = 0.0  # the fullest the KV cache has been since the engine started


class SnapshotStatLogger(StatLoggerBase):
    """Writes into a shared `KvSnapshot`; vLLM calls `record` after every engine step."""

    def __init__(self, vllm_config, engine_index: int = 0, snapshot: KvSnapshot | None = None):
        self.snapshot = snapshot if snapshot is not None else KvSnapshot()

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
        if scheduler_stats is not None:
            self.snapshot.usage = scheduler_stats.kv_cache_usage
            self.snapshot.peak_usage = max(self.snapshot.peak_usage, scheduler_stats.kv_cache_usage)
            self.snapshot.num_running = scheduler_stats.num_running_reqs
            self.snapshot.num_waiting = scheduler_stats.num_waiting_reqs
            self.snapshot.steps += 1
        if iteration_stats is not None:
            self.snapshot.preemptions += iteration_stats.num_preempted_reqs

    def log_engine_initialized(self):
        pass


def snapshot_logger_factory(snapshot: KvSnapshot):
    """vLLM builds loggers from factories `(vllm_config, engine_index) -> logger`."""

    def factory(vllm_config, engine_index: int = 0):
        return SnapshotStatLogger(vllm_config, engine_index, snapshot)

    return factory
