"""The control-plane and node faults of `bench.reliability`, each fired at a set moment of the load.

- `engine_node_cluster`: a `ray.cluster_utils.Cluster` on this machine, a head node (control plane,
  ingress replicas, no engine) and two worker nodes, each engine replica asking for one
  `ENGINE_RESOURCE` so there is one per worker node;
- `remove_node`: the worker node whose engine replica holds the most sessions goes (its raylet and
  every process on it: the engine replica and the sessions it held), and a fresh node joins
  `replace_after_s` later, where Serve starts the missing replica (a node replaced by the cluster's
  launcher);
- `restart_central`: the central scheduler actor is killed and Ray restarts it; it rebuilds
  placements from the replicas' next reports;
- `kill_shard`: one session-record shard is killed and Ray restarts it; it reloads its journal.

Each records when it fired, what it hit and, where a snapshot can tell, the sessions it hit: those on
the replica that went (`/v1/cluster`, read just before), those whose record the shard held
(`pipeline.sessions.store.shard_index`). The summary adds what became of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter

import httpx

from pipeline.control.central import NAMESPACE

ENGINE_RESOURCE = "reliability_engine_node"   # one per worker node: one engine replica per node
INGRESS_RESOURCE = "reliability_ingress_node"  # on the head only: the ingress replicas stay there
HEAD_CPUS = 2


@contextlib.contextmanager
def engine_node_cluster(engine_nodes: int = 2):
    """The head (control plane, ingress) and `engine_nodes` worker nodes, one engine replica each;
    torn down after."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": HEAD_CPUS, "include_dashboard": False, "resources": {INGRESS_RESOURCE: 1}})
    for _ in range(engine_nodes):
        cluster.add_node(num_cpus=1, resources={ENGINE_RESOURCE: 1})
    try:
        yield cluster
    finally:
        cluster.shutdown()


async def _until(t0: float, at_s: float) -> None:
    await asyncio.sleep(max(0.0, t0 + at_s - time.monotonic()))


async def _replica_sessions(http: httpx.AsyncClient, base: str) -> dict:
    with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
        return (await http.get(f"{base}/v1/cluster")).json()["replicas"]
    return {}


async def remove_node(http: httpx.AsyncClient, base: str, cluster, t0: float, at_s: float,
                      replace_after_s: float, record: dict) -> dict:
    """At `at_s`, remove the worker node whose engine replicas hold the most sessions; add a fresh
    one after a while."""
    await _until(t0, at_s)
    head = cluster.head_node.node_id
    workers = [n for n in cluster.worker_nodes if n.node_id != head]
    if not workers:
        return {"fault": "node_removal", "fired": False, "reason": "no worker node"}
    replicas = await _replica_sessions(http, base)
    held = Counter()
    for r in replicas.values():
        held[r.get("node_id")] += len(r["sessions"])
    victim = max(workers, key=lambda n: held.get(n.node_id, 0))
    on_node = {rid: r["sessions"] for rid, r in replicas.items() if r.get("node_id") == victim.node_id}
    await asyncio.to_thread(cluster.remove_node, victim)
    record.update(fault="node_removal", fired=True, at_s=round(time.monotonic() - t0, 2), node_id=victim.node_id,
                  replicas=sorted(on_node), sessions=sorted(s for ss in on_node.values() for s in ss))
    await asyncio.sleep(replace_after_s)
    # in the driver's main thread (Ray's node start installs signal handlers): the load's clients
    # pause for the second or two it takes
    joined = cluster.add_node(num_cpus=1, resources={ENGINE_RESOURCE: 1})
    record.update(replacement_node_id=joined.node_id, replaced_at_s=round(time.monotonic() - t0, 2))
    return record


def _kill_restartable(name: str) -> None:
    import ray

    ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=False)


def _started_at(name: str) -> float | None:
    import ray

    with contextlib.suppress(Exception):
        return ray.get(ray.get_actor(name, namespace=NAMESPACE).ping.remote(), timeout=5)["started_at"]
    return None


async def restart_central(actor_name: str, t0: float, at_s: float, record: dict) -> dict:
    """Kill the central scheduler at `at_s` (Ray restarts it); time until the new one answers."""
    await _until(t0, at_s)
    before = await asyncio.to_thread(_started_at, actor_name)
    await asyncio.to_thread(_kill_restartable, actor_name)
    killed = time.monotonic()
    record.update(fault="central_restart", fired=True, at_s=round(killed - t0, 2), actor=actor_name)
    while time.monotonic() - killed < 120:
        now = await asyncio.to_thread(_started_at, actor_name)
        if now is not None and now != before:
            record["back_after_s"] = round(time.monotonic() - killed, 2)
            return record
        await asyncio.sleep(0.25)
    record["back_after_s"] = None
    return record


def _kill_shard_and_wait(name: str) -> float | None:
    """Kill the shard; seconds until its restarted self answers a call (None: not within 120 s)."""
    import ray

    shard = ray.get_actor(name, namespace=NAMESPACE)
    ray.kill(shard, no_restart=False)
    killed = time.monotonic()
    while time.monotonic() - killed < 120:
        with contextlib.suppress(Exception):
            ray.get(shard.count.remote(), timeout=5)
            return round(time.monotonic() - killed, 2)
        time.sleep(0.25)
    return None


async def kill_shard(actor_name: str, shards: int, t0: float, at_s: float, record: dict) -> dict:
    """At `at_s`, kill the session-record shard holding the most open streaming-input sessions
    (`bench.reliability_streams.OPEN_STREAMS`); Ray restarts it from its journal."""
    from bench.reliability_streams import OPEN_STREAMS
    from pipeline.sessions.store import shard_index, shard_name

    await _until(t0, at_s)
    open_now = Counter(shard_index(sid, shards) for sid in OPEN_STREAMS)
    index = max(range(shards), key=lambda i: open_now[i])
    name = shard_name(actor_name, index)
    record.update(fault="shard_kill", fired=True, at_s=round(time.monotonic() - t0, 2), shard=name,
                  shard_index=index, shards=shards, open_on_shard=open_now[index])
    record["back_after_s"] = await asyncio.to_thread(_kill_shard_and_wait, name)
    return record
