"""The central scheduler as a real Ray actor (no model): settings on redeploy, one-shot admission,
draining, health with a timeout, and a restart that keeps settings and rebuilds from reports."""

import asyncio
import os
import time

import pytest
import ray

from pipeline.control.central import SchedulerUnavailable, get_or_create_scheduler, scheduler_health
from pipeline.config import AppConfig

pytestmark = pytest.mark.timeout(300)


def config(name: str, **scheduler):
    return AppConfig.model_validate({
        "limits": {"max_queue": 0, "admission_timeout_s": 1.0},
        "scheduler": {"actor_name": name, "demand_priors": {"client": 160}, **scheduler}})


def report(rid, used=0, sessions=None):
    return {"replica_id": rid, "kv_blocks_total": 100, "kv_blocks_used": used, "block_size": 16,
            "sessions": sessions or {}, "source_types": {s: "client" for s in sessions or {}}}


def wait_for(predicate, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


@pytest.fixture
def central_name(request) -> str:
    """An actor of its own per test: no test sees another's replicas or placements, in any order."""
    return "test_central_" + "".join(c if c.isalnum() else "_" for c in request.node.name)


@pytest.fixture
def central(local_ray, central_name):
    handle = get_or_create_scheduler(config(central_name))
    yield handle
    ray.kill(handle, no_restart=True)


def test_admit_request_drain_and_release(central):
    ray.get(central.report.remote(report("a")))
    ray.get(central.report.remote(report("b", used=40)))
    assert ray.get(central.admit_request.remote("req", 320, 1.0)) == {"replica_id": "a"}
    assert ray.get(central.pressure.remote())["kv_blocks_projected"] == 20 + 40
    assert ray.get(central.drain.remote("a")) == 1
    assert ray.get(central.admit.remote("s", "client", 1.0, tokens=160)) == {"replica_id": "b"}
    ray.get(central.release.remote("req"))
    assert ray.get(central.sessions_on.remote("a")) == 0
    assert ray.get(central.replicas.remote())["a"]["draining"] is True
    # the recovery of s flees b; a drains: nowhere to go within the timeout -> 429 (queue size 0 for new ones)
    decision = ray.get(central.admit.remote("s", "client", 0.5, ["b"], recovery=True))
    assert decision["rejected"] and decision["retry_after_s"] >= 1
    ray.get(central.drain.remote("a", False))


def test_before_any_replica_reported_a_wait_ends_unavailable_and_oversized_never_fits(central):
    # replicas still starting: the wait ends as "unavailable" (503), not "rejected" (429)
    decision = ray.get(central.admit.remote("early", "client", 0.3))
    assert decision["unavailable"] and decision["retry_after_s"] >= 1 and "rejected" not in decision
    assert ray.get(central.pressure.remote())["rejected"] == 0
    ray.get(central.report.remote(report("a")))
    # larger than every replica's KV (100 blocks of 16 tokens): refused at once, never queued
    decision = ray.get(central.admit_request.remote("req", 1601, 30.0))
    assert "never_fits" in decision and ray.get(central.pressure.remote())["queued"] == 0
    assert ray.get(central.admit_request.remote("req", 800, 1.0)) == {"replica_id": "a"}


def test_redeploy_settings_take_effect_and_survive_a_restart(central, central_name):
    assert ray.get(central.configure.remote({}))["max_queue"] == 0
    handle = get_or_create_scheduler(config(central_name, grace_s=3.0))  # a redeploy with new settings
    assert handle._actor_id == central._actor_id
    wait_for(lambda: ray.get(handle.configure.remote({}))["grace_s"] == 3.0)
    started = ray.get(handle.ping.remote())["started_at"]
    ray.kill(handle, no_restart=False)
    wait_for(lambda: _started_at(handle) not in (None, started))
    assert ray.get(handle.configure.remote({}))["grace_s"] == 3.0  # read back from the GCS, not the old args
    ray.get(handle.report.remote(report("a", used=10, sessions={"kept": 160})))
    assert ray.get(handle.lookup.remote("kept")) == "a"  # rebuilt from the next report


def test_health_check_has_a_timeout(central):
    ray.get(central.report.remote(report("h1")))
    assert asyncio.run(scheduler_health(central, timeout_s=30.0))["replicas"] == 1

    @ray.remote(num_cpus=0)
    class Stuck:
        async def pressure(self):
            await asyncio.sleep(3600)

    with pytest.raises(SchedulerUnavailable):
        asyncio.run(scheduler_health(Stuck.remote(), timeout_s=0.5))


def _started_at(handle):
    try:
        return ray.get(handle.ping.remote(), timeout=5)["started_at"]
    except Exception:
        return None


def test_drain_replica_stops_new_placements_there(central):
    from pipeline.control.central_client import drain_replica

    ray.get(central.report.remote(report("d1")))
    ray.get(central.report.remote(report("d2", used=5)))  # the roomiest after d1
    assert ray.get(central.admit.remote("held", "client", 1.0, tokens=16)) == {"replica_id": "d1"}
    assert asyncio.run(drain_replica(central, "d1")) == 1  # "held" is still placed there
    assert ray.get(central.replicas.remote())["d1"]["draining"] is True
    assert ray.get(central.admit.remote("after-drain", "client", 1.0, tokens=16)) == {"replica_id": "d2"}
    moved = ray.get(central.admit.remote("held", "client", 1.0, ["d1"], recovery=True))
    assert moved == {"replica_id": "d2"} and ray.get(central.sessions_on.remote("d1")) == 0


def test_batched_client_admits_and_releases_in_few_calls(central):
    from pipeline.control.central_client import CentralClient

    ray.get(central.report.remote(report("c1")))

    async def scenario():
        client = CentralClient(central)
        decisions = await asyncio.gather(*(client.admit(f"b{i}", "client", 5.0, tokens=16) for i in range(40)))
        for i in range(40):
            client.release(f"b{i}")  # posted: returns before the actor has it
        await client.flush()
        return decisions, client.calls

    decisions, calls = asyncio.run(scenario())
    assert all("replica_id" in d for d in decisions) and calls <= 10
    assert all(ray.get(central.lookup.remote(f"b{i}")) is None for i in range(40))


def test_admissions_from_slots_skip_the_actor_and_are_placed_there_afterwards(central):
    """After admissions of a type, the client holds about as many slots and admits the next ones
    without an actor call; every session is placed where the client said, and releases free the room."""
    from pipeline.control.central_client import CentralClient

    ray.get(central.report.remote({**report("c1"), "kv_blocks_total": 1000}))  # room for slots

    async def scenario():
        client = CentralClient(central, slots=4)
        first = await asyncio.gather(*(client.admit(f"w{i}", "client", 5.0) for i in range(4)))
        await client.flush()  # no slots yet: through the actor, whose reply brought 4 slots
        calls = client.calls
        later = [await client.admit(f"s{i}", "client", 5.0) for i in range(4)]
        from_slots, calls_during = client.from_slots, client.calls - calls
        await client.flush()
        placed = [await central.lookup.remote(f"s{i}") for i in range(4)]
        for sid in [f"{p}{i}" for p in "ws" for i in range(4)]:
            client.release(sid)
        await client.flush()
        still_held = (sum(len(h) for h in client._slots.values()), await central.sessions_on.remote("c1"))
        await central.drain.remote("c1")  # scale-down begins: its slots go with the next reply
        client.release("not-placed")     # any batch brings that reply
        await client.flush()
        held_after_drain = sum(len(h) for h in client._slots.values())
        after_drain = await client.admit("after", "client", 5.0)  # through the actor: nowhere to go
        return first, later, from_slots, calls_during, placed, still_held, held_after_drain, after_drain

    first, later, from_slots, calls_during, placed, still_held, held_after_drain, after_drain = asyncio.run(scenario())
    assert first == [{"replica_id": "c1"}] * 4 and later == [{"replica_id": "c1"}] * 4
    assert from_slots == 4 and calls_during <= 1  # the bindings ride one posted batch
    assert placed == ["c1"] * 4
    assert still_held[0] == still_held[1] > 0  # only the unused slots remain placed
    assert held_after_drain == 0 and "rejected" in after_drain


def test_slots_go_back_when_a_session_waits_in_the_queue(local_ray, central_name):
    """A slot would let a new session pass one waiting in the actor's queue: the first reply that
    says somebody waits makes the client give its slots back, and the next admission queues too."""
    from pipeline.control.central_client import CentralClient

    handle = get_or_create_scheduler(AppConfig.model_validate({
        "limits": {"max_queue": 4, "admission_timeout_s": 1.0},
        "scheduler": {"actor_name": central_name, "demand_priors": {"client": 160}}}))
    ray.get(handle.report.remote({**report("q1"), "kv_blocks_total": 1000}))

    async def scenario():
        client = CentralClient(handle, slots=4)
        await asyncio.gather(*(client.admit(f"w{i}", "client", 5.0) for i in range(4)))
        await client.flush()
        held_before = sum(len(h) for h in client._slots.values())
        await handle.report.remote({**report("q1"), "kv_blocks_total": 1000, "kv_blocks_used": 1000})
        waiting = asyncio.ensure_future(handle.admit.remote("waits", "client", 60.0))
        deadline = time.monotonic() + 30
        while (await handle.pressure.remote())["queued"] < 1:  # in the queue now (no room)
            assert time.monotonic() < deadline, "the session never queued"
            await asyncio.sleep(0.05)
        client.release("w0")  # any batch brings a reply that says so
        await client.flush()
        held_after, from_slots = sum(len(h) for h in client._slots.values()), client.from_slots
        late = await client.admit("late", "client", 0.5)
        await handle.report.remote({**report("q1"), "kv_blocks_total": 1000})  # room again: "waits" goes in
        return held_before, held_after, client.from_slots - from_slots, late, await waiting

    try:
        held_before, held_after, taken, late, waited = asyncio.run(scenario())
    finally:
        ray.kill(handle, no_restart=True)
    assert held_before > 0 and held_after == 0
    assert taken == 0 and "rejected" in late  # queued behind "waits", not placed from a slot
    assert waited == {"replica_id": "q1"}  # room again: the session that waited in the queue is placed


class _FailingBatches:
    """A handle whose batch call fails (the actor died mid-call); records what it was sent."""

    def __init__(self):
        self.sent = []
        self.batch = self

    async def _fail(self, releases, asks):
        self.sent.append((list(releases), [a["session_id"] for a in asks]))
        raise ray.exceptions.RayActorError()

    def remote(self, releases, asks, *slot_traffic):
        return self._fail(releases, asks)


def test_session_shards_take_a_redeploys_ttl(local_ray, central_name):
    """The detached shards outlive the deployment that made them: a redeploy's shorter idle TTL
    still applies to them (without `configure` they kept the first one, 300 s here). Configure calls
    come from different ingress replicas in no set order: one issued earlier that arrives later
    (as the first store's did now and then) does not undo the redeploy's."""
    from pipeline.errors import SessionGone
    from pipeline.sessions.store import SessionStore
    from pipeline.sessions.log import SessionLog

    def store(ttl_s: float) -> SessionStore:
        return SessionStore(AppConfig.model_validate({"limits": {"session_ttl_s": ttl_s},
                                                      "scheduler": {"actor_name": central_name},
                                                      "ingress": {"session_shards": 1}}))

    async def scenario():
        first = store(300.0)
        await first.add(SessionLog("s1", "client", "r1"))
        assert (await first.get("s1", for_change=False))[0].replica_id == "r1"
        issued = time.time()
        store(0.5)  # the redeploy: the same named shard, a shorter TTL
        first.started_shards()[0].configure.remote(300.0, issued - 1.0)  # an older deployment's, arriving late
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                await first.get("s1", for_change=False)
            except SessionGone:
                return True
            await asyncio.sleep(0.2)
        return False

    assert asyncio.run(scenario()), "the record outlived the redeploy's TTL"


def test_a_session_shard_starts_with_its_first_session(local_ray, central_name):
    """Lookups, counts and changes of unknown sessions start no shard (OpenAI-only traffic runs
    none); the first session starts its shard, which another store (another ingress) then finds."""
    from pipeline.errors import SessionGone
    from pipeline.sessions.log import SessionLog
    from pipeline.sessions.store import SessionStore, shard_index, shard_name

    data = {"scheduler": {"actor_name": central_name}, "ingress": {"session_shards": 4}}
    store = SessionStore(AppConfig.model_validate(data))

    async def unknown_then_one():
        with pytest.raises(SessionGone):
            await store.get("nobody", for_change=False)
        with pytest.raises(SessionGone):
            await store.finish("nobody")
        assert not await store.drop("nobody") and await store.begin_move("nobody", "r1") is None
        assert await store.count() == 0 and store.started_shards() == []
        await store.add(SessionLog("s1", "client", "r1"))
        return await store.count()

    assert asyncio.run(unknown_then_one()) == 1
    started = shard_name(central_name, shard_index("s1", 4))
    named = {actor["name"] for actor in ray.util.list_named_actors(all_namespaces=True)}
    assert [shard_name(central_name, i) for i in range(4) if shard_name(central_name, i) in named] == [started]
    other = SessionStore(AppConfig.model_validate(data))  # another ingress: finds the started shard
    assert asyncio.run(other.get("s1", for_change=False))[0].replica_id == "r1"
    for shard in other.started_shards():
        ray.kill(shard, no_restart=True)


def test_a_killed_session_shard_restarts_with_its_records(local_ray, central_name):
    """The shard's process dies (as on an OOM kill); Ray restarts it and it reloads its journal: the
    open session keeps its context, citations and last sequence number (a retried change is still a
    duplicate), the finished one still refuses a second finish."""
    from pipeline.errors import SessionConflict
    from pipeline.sessions.store import SessionStore
    from pipeline.sessions.log import SessionLog
    from stream2llm.data.traces import ContextOp

    store = SessionStore(AppConfig.model_validate({"scheduler": {"actor_name": central_name},
                                                   "ingress": {"session_shards": 1}}))

    async def before():
        await store.add(SessionLog("open", "client", "r1"))
        log, duplicate = await store.get("open", claim_seq=0)
        assert not duplicate
        log.last_seq, log.context_tokens = 0, 7
        await store.commit(log, (ContextOp.APPEND, "the context"), [{"title": "cited"}])
        await store.add(SessionLog("done", "client", "r1"))
        await store.finish("done")

    async def after():
        log, duplicate = await store.get("open", claim_seq=0)
        with pytest.raises(SessionConflict):
            await store.finish("done")
        return log, duplicate

    asyncio.run(before())
    pid = ray.get(store.started_shards()[0].__ray_call__.remote(lambda self: os.getpid()))
    ray.kill(store.started_shards()[0], no_restart=False)
    log, duplicate = asyncio.run(after())  # the call waits for the restart (max_task_retries)
    assert ray.get(store.started_shards()[0].__ray_call__.remote(lambda self: os.getpid())) != pid
    assert duplicate and log.ops == [(ContextOp.APPEND, "the context")]
    assert log.sources == [{"title": "cited"}] and log.context_tokens == 7 and log.replica_id == "r1"
    ray.kill(store.started_shards()[0], no_restart=True)


def test_posted_release_does_not_wait_and_a_failed_batch_fails_only_its_admissions(caplog):
    """A release returns before the actor has it; when its batch fails it is logged (reconciliation
    drops the placement), while an admission in the same batch gets the error."""
    from pipeline.control.central_client import CentralClient

    async def scenario():
        handle = _FailingBatches()
        client = CentralClient(handle)
        assert client.release("gone", 100) is None and handle.sent == []  # nothing sent yet
        with pytest.raises(ray.exceptions.RayActorError):
            await client.admit("new", "client", 1.0)
        await client.flush()
        return handle.sent

    sent = asyncio.run(scenario())
    assert sent[0] == ([("gone", 100)], ["new"])
    assert "1 releases and 0 slot bindings lost" in caplog.text
