"""Unmodified vLLM v1 order: the running list in admission order, then the waiting queue.

vLLM puts a preempted request back at the front of the waiting queue, and preempts the most
recently admitted running request: the tail of this order among running requests. Idle partial
streams get no special treatment: they stay in the running list where they were admitted.
"""

from scheduler.policies.base import Policy
from scheduler.request import RequestView


class DefaultVllmPolicy(Policy):
    name = "default_vllm"

    def sort_key(self, view: RequestView) -> tuple:
        if view.running:
            return (0, view.admitted_seq, view.seq)
        return (1, 0 if view.num_preemptions else 1, view.first_chunk_arrival, view.seq)
