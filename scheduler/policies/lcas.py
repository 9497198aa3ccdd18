"""LCAS, last chunk arrival (paper): complete before partial, each by last-chunk arrival time;
requests with nothing left to compute last."""

from scheduler.policies.base import Policy, has_no_work
from scheduler.request import RequestView


class LcasPolicy(Policy):
    name = "lcas"

    def sort_key(self, view: RequestView) -> tuple:
        return (has_no_work(view), not view.complete, view.last_chunk_arrival, view.seq)
