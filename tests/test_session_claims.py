"""A change's `seq` claim and its commit (pipeline.sessions.store), with real Ray actors: an ingress
that dies between the two leaves no hole. The ingress is a named actor in Serve's namespace, as an
ingress replica is; it claims a change and is killed before it commits (the fault at that moment).
Before the claim and the commit were one step of the log, the claim alone raised the session's
last seq, so the client's retry came back `duplicate: true` and the change was never recorded."""

import asyncio
import time
import uuid

import pytest
import ray
from ray.serve._private.constants import SERVE_NAMESPACE

from pipeline.config import AppConfig
from pipeline.control.liveness import serve_actor_alive
from pipeline.errors import SessionConflict
from pipeline.sessions.log import SessionLog
from pipeline.sessions.store import SessionStore
from stream2llm.data.traces import ContextOp


@pytest.fixture
def config(local_ray):
    """Shards of their own (named after a fresh central actor name), killed after the test."""
    data = {"scheduler": {"actor_name": f"test_claims_{uuid.uuid4().hex[:8]}"}, "ingress": {"session_shards": 1}}
    yield data
    for shard in SessionStore(AppConfig.model_validate(data)).started_shards():
        ray.kill(shard, no_restart=True)


@ray.remote(num_cpus=0)
class IngressStandIn:
    """What an ingress replica does with the store, under an ingress-like actor name."""

    def __init__(self, config: dict, name: str):
        self.store = SessionStore(AppConfig.model_validate(config), owner=name)

    async def claim(self, session_id: str, seq: int) -> bool:
        _, duplicate = await self.store.get(session_id, claim_seq=seq)
        return duplicate


async def apply(store: SessionStore, session_id: str, seq: int, text: str) -> bool:
    """A change as the ingress makes it: claim, (apply on the replica), commit. True: a duplicate."""
    log, duplicate = await store.get(session_id, claim_seq=seq)
    if duplicate:
        return True
    log.last_seq = seq
    await store.commit(log, (ContextOp.APPEND, text), [])
    return False


def wait_dead(name: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while asyncio.run(serve_actor_alive(name)):
        assert time.monotonic() < deadline, f"{name} still listed"
        time.sleep(0.2)


def test_an_ingress_dying_between_claim_and_commit_leaves_no_hole(config):
    retrier = SessionStore(AppConfig.model_validate(config), owner="SERVE_REPLICA::ingress-b")
    asyncio.run(retrier.add(SessionLog("s", "client", "r1")))
    name = f"SERVE_REPLICA::ingress-a-{uuid.uuid4().hex[:6]}"
    dying = IngressStandIn.options(name=name, namespace=SERVE_NAMESPACE).remote(config, name)
    assert ray.get(dying.claim.remote("s", 0)) is False  # claimed: now applying on the replica ...

    with pytest.raises(SessionConflict, match="being applied"):  # ... a retry meanwhile waits for it
        asyncio.run(apply(retrier, "s", 0, "chunk 0"))
    ray.kill(dying, no_restart=True)  # ... and it dies before its commit
    wait_dead(name)

    assert asyncio.run(apply(retrier, "s", 0, "chunk 0")) is False  # the retry applies it: no hole
    assert asyncio.run(apply(retrier, "s", 0, "chunk 0")) is True   # and is a duplicate from then on
    log, _ = asyncio.run(retrier.get("s", for_change=False))
    assert log.ops == [(ContextOp.APPEND, "chunk 0")] and log.last_seq == 0


def test_a_failed_change_frees_its_claim_and_commits_never_lower_the_seq(config):
    store = SessionStore(AppConfig.model_validate(config), owner="SERVE_REPLICA::ingress-c")

    async def scenario():
        await store.add(SessionLog("t", "client", "r1"))
        log, duplicate = await store.get("t", claim_seq=1)
        assert not duplicate
        await store.unclaim(log, 1)  # the replica refused the change: nothing recorded
        assert not (await store.get("t", claim_seq=1))[1]
        await store.unclaim(log, 1)
        # two changes in flight from one ingress; the later one commits first
        first, _ = await store.get("t", claim_seq=2)
        second, _ = await store.get("t", claim_seq=3)
        second.last_seq = 3
        await store.commit(second, (ContextOp.APPEND, "three"), [])
        first.last_seq = 2
        await store.commit(first, (ContextOp.APPEND, "two"), [])
        log, duplicate = await store.get("t", claim_seq=3)
        return log, duplicate

    log, duplicate = asyncio.run(scenario())
    assert duplicate and log.last_seq == 3
    assert [text for _, text in log.ops] == ["three", "two"]


def test_a_move_holds_reads_of_the_session_until_it_ends_and_one_mover_at_a_time(config):
    """The move mark (scale-down drain, `pipeline.replica.drain`): a read of the session while it
    moves waits and then sees where it went; so does a second mover, which is then refused (the
    replica it names no longer holds the session); a failed move leaves the record as it was; a
    pending change (claim) keeps a stopping replica's mover off."""
    store = SessionStore(AppConfig.model_validate(config), owner="SERVE_REPLICA::ingress-d")

    async def scenario():
        await store.add(SessionLog("m", "client", "victim"))
        moving = await store.begin_move("m", "victim")
        assert moving is not None and moving.replica_id == "victim"
        second = asyncio.ensure_future(store.begin_move("m", "victim"))  # one mover at a time ...
        read = asyncio.ensure_future(store.get("m", for_change=False))
        await asyncio.sleep(0.5)
        assert not read.done() and not second.done()  # ... and a read waits for the move to end
        moving.replica_id, moving.node_id, moving.context_tokens = "target", "n2", 42
        assert await store.end_move(moving)
        after, _ = await asyncio.wait_for(read, 30)
        assert (after.replica_id, after.context_tokens) == ("target", 42)
        assert await asyncio.wait_for(second, 30) is None  # the session is not on "victim" any more
        again = await store.begin_move("m", "target")
        assert await store.end_move(None, "m")  # failed: nothing changes
        assert (await store.get("m", for_change=False))[0].replica_id == "target" and again is not None
        await store.get("m", claim_seq=0)  # a change being applied ...
        assert await store.begin_move("m", "target", yield_to_changes=True) is None  # ... its ingress recovers it

    asyncio.run(scenario())
