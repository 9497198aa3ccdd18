"""`pipeline.replica.session_owners.SessionOwners`: which idle one-request sessions lost their ingress.

The liveness lookup is passed in (on a replica it asks Ray for the ingress actor by name); here a
set of live owners stands in for it, to check the bookkeeping: who is asked, how often, and which
sessions come back. tests/test_pipeline_ingress.py checks the real thing with a killed ingress.
"""

from pipeline.replica.session_owners import SessionOwners


class Owners:
    def __init__(self, alive: set[str]):
        self.alive = alive
        self.asked: list[str] = []
        self.now = 0.0

    async def is_alive(self, name: str) -> bool:
        self.asked.append(name)
        return name in self.alive

    def clock(self) -> float:
        return self.now


async def test_sessions_of_a_dead_owner_are_orphans_and_others_are_not():
    owners = Owners({"ingress-a"})
    table = SessionOwners(owners.is_alive, recheck_s=5.0, clock=owners.clock)
    for sid, owner in [("s1", "ingress-a"), ("s2", "ingress-b"), ("s3", "ingress-b"), ("s4", None)]:
        table.add(sid, owner)
    assert sorted(await table.orphans(["s1", "s2", "s3", "s4", "unknown"])) == ["s2", "s3"]
    assert sorted(owners.asked) == ["ingress-a", "ingress-b"]  # one lookup per owner, not per session
    assert await table.orphans(["s1"]) == []


async def test_a_live_owner_is_trusted_for_recheck_s_and_a_forgotten_session_is_never_an_orphan():
    owners = Owners({"ingress-a"})
    table = SessionOwners(owners.is_alive, recheck_s=5.0, clock=owners.clock)
    table.add("s1", "ingress-a")
    table.add("s2", "ingress-a")
    await table.orphans(["s1"])
    owners.alive.clear()  # it dies
    owners.now = 4.0
    assert await table.orphans(["s1", "s2"]) == [] and owners.asked == ["ingress-a"]
    table.forget("s2")
    owners.now = 5.5
    assert await table.orphans(["s1", "s2"]) == ["s1"] and owners.asked == ["ingress-a", "ingress-a"]
