"""Policy registry: one file per policy, a dict of names, a factory that lists valid names."""

from scheduler.policies.base import Policy
from scheduler.policies.default_vllm import DefaultVllmPolicy
from scheduler.policies.fcfs import FcfsPolicy
from scheduler.policies.lcas import LcasPolicy
from scheduler.policies.mcps import McpsPolicy
from scheduler.policies.tailguard import TailGuardPolicy

POLICIES: dict[str, type[Policy]] = {
    cls.name: cls
    for cls in (DefaultVllmPolicy, FcfsPolicy, LcasPolicy, McpsPolicy, TailGuardPolicy)
}


class UnknownPolicyError(ValueError):
    def __init__(self, name: str):
        self.name = name
        self.valid = sorted(POLICIES)
        super().__init__(f"unknown scheduling policy {name!r}; valid: {', '.join(self.valid)}")


def make_policy(name: str) -> Policy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise UnknownPolicyError(name) from None


__all__ = ["POLICIES", "Policy", "UnknownPolicyError", "make_policy"]
