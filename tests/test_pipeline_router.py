"""The engine's request router (`pipeline.control.router`) on real Ray:
- its own liveness check (`actor_dead`): Ray core's local view in this process, which the router
  uses to drop a dead replica without waiting for Serve's controller update (the drills time the
  whole path per ingress);
- under real Serve: an open waiting for a replica the router has not listed yet (`OPEN_WAIT_S`)
  holds only that call; other calls from the same process are routed meanwhile (the wait once spun
  the router's event loop: every call and every replica-list update of the process stalled).
"""

import time
from types import SimpleNamespace

import pytest
import ray
from ray import serve
from ray.serve.config import RequestRouterConfig

from pipeline.control.router import OPEN_WAIT_S, AffinityRouter, actor_dead
from pipeline_fixtures import wait_until


@ray.remote(num_cpus=0)
class _Replica:
    def ping(self) -> int:
        return 1


@pytest.fixture(scope="module")
def local_ray():
    ray.init(address="local", num_cpus=1, include_dashboard=False)
    try:
        yield
    finally:
        ray.shutdown()


def test_a_killed_replica_reads_dead_locally_and_a_live_one_does_not(local_ray):
    handle = _Replica.remote()
    ray.get(handle.ping.remote())  # as Serve's router probes a replica it is given
    replica = SimpleNamespace(_actor_handle=handle)
    assert not actor_dead(replica)
    ray.kill(handle)
    deadline = time.monotonic() + 30
    while not actor_dead(replica) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert actor_dead(replica)


def test_a_wrapper_without_a_handle_is_not_taken_for_dead():
    assert not actor_dead(SimpleNamespace())  # a Serve version that renames the field: no false drop


@serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 0},
                  request_router_config=RequestRouterConfig(request_router_class=AffinityRouter))
class _Sessions:
    def __init__(self):
        self.opened = 0

    def open_session(self, session_id: str, route_to=None) -> str:
        self.opened += 1
        return session_id

    def opened_so_far(self, route_to=None) -> int:
        return self.opened


@serve.deployment(ray_actor_options={"num_cpus": 0})
class _Caller:
    """Calls from one process (one router), each in its own request: Serve matches routed calls to
    requests by request id, so two calls of one request would not be two independent calls."""

    def __init__(self, sessions):
        self.sessions = sessions
        self.open_started: float | None = None
        self.open_took: float | None = None

    async def open_on_an_unlisted_replica(self) -> str:
        self.open_started = time.monotonic()
        session = await self.sessions.open_session.remote("s1", route_to="a-replica-not-listed-yet")
        self.open_took = time.monotonic() - self.open_started
        return session

    def open_state(self) -> dict:
        """How long the open has been under way, and (once it returned) how long it took."""
        running = None if self.open_started is None else time.monotonic() - self.open_started
        return {"running_s": running, "took_s": self.open_took}

    async def opened_so_far(self) -> int:
        return await self.sessions.opened_so_far.remote()


def test_an_open_waiting_for_an_unlisted_replica_does_not_hold_other_calls(local_ray):
    handle = serve.run(_Caller.bind(_Sessions.bind()), name="router_wait", route_prefix=None)
    try:
        assert handle.opened_so_far.remote().result(timeout_s=120) == 0  # the router lists the replica
        opening = handle.open_on_an_unlisted_replica.remote()
        # the open has been under way a while and has not returned: it is in its wait (OPEN_WAIT_S)
        state = handle.open_state
        wait_until(lambda: (state.remote().result(timeout_s=60)["running_s"] or 0) >= 1.0, timeout=60, interval=0.1)
        # another call from the same process (the same router) is routed and answered meanwhile ...
        assert handle.opened_so_far.remote().result(timeout_s=120) == 0
        # ... while the open still waited: it had not returned then, and the router held it its whole wait
        assert state.remote().result(timeout_s=60)["took_s"] is None
        assert opening.result(timeout_s=120) == "s1"  # its wait over, it fell back to the replica there is
        assert state.remote().result(timeout_s=60)["took_s"] >= OPEN_WAIT_S - 1.0
        assert handle.opened_so_far.remote().result(timeout_s=120) == 1
    finally:
        serve.delete("router_wait")
        serve.shutdown()
