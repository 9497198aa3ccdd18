"""MCPS, most computed first (paper): all requests by computed tokens, descending, then arrival;
requests with nothing left to compute last."""

from scheduler.policies.base import Policy, has_no_work
from scheduler.request import RequestView


class McpsPolicy(Policy):
    name = "mcps"

    def sort_key(self, view: RequestView) -> tuple:
        return (has_no_work(view), -view.num_computed_tokens, view.first_chunk_arrival, view.seq)
