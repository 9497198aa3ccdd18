"""The engine router's own liveness check (`pipeline.router.actor_dead`) on a real Ray actor: Ray
core's local view in this process, which the router uses to drop a dead replica without waiting for
Serve's controller update (the drills time the whole path per ingress)."""

import time
from types import SimpleNamespace

import pytest
import ray

from pipeline.router import actor_dead


@ray.remote(num_cpus=0)
class _Replica:
    def ping(self) -> int:
        return 1


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=1, include_dashboard=False)
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
