"""FCFS (paper): complete requests by first-chunk arrival, then partial ones by first-chunk
arrival; requests with nothing left to compute last."""

from scheduler.policies.base import Policy, has_no_work
from scheduler.request import RequestView


class FcfsPolicy(Policy):
    name = "fcfs"

    def sort_key(self, view: RequestView) -> tuple:
        return (has_no_work(view), not view.complete, view.first_chunk_arrival, view.seq)
