"""The cluster side of `bench.reliability`: memory sampling, the replica- and ingress-kill drills,
and the drain (leak) check after the load.

- `collect_memory`: RSS of this Ray cluster's processes and Serve's running replica count over time;
- `kill_busiest_replica`: the replica-kill drill; `kill_an_ingress`: the ingress-kill drill;
  `drain`: the leak check after the load.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import httpx

from pipeline.app import ENGINE_DEPLOYMENT, INGRESS_DEPLOYMENT
from pipeline.config import AppConfig

MEMORY_INTERVAL_S = 1.0
APP = AppConfig.model_fields["name"].default  # the bench runs the app under its default name


# ---- cluster-side sampling and drills --------------------------------------------------------------
def cluster_rss_mb() -> dict:
    """RSS of the driver's descendants (this Ray cluster only: raylet, GCS, workers)."""
    import psutil

    total = workers = 0
    count = 0
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            rss = proc.memory_info().rss
            total += rss
            if " ".join(proc.cmdline()[:1]).startswith("ray::"):
                workers += rss
                count += 1
    return {"ray_rss_mb": round(total / 2**20, 1), "worker_rss_mb": round(workers / 2**20, 1), "workers": count}


def running_replicas() -> int | None:
    from ray import serve

    with contextlib.suppress(Exception):
        app = serve.status().applications.get(APP)
        return int(app.deployments[ENGINE_DEPLOYMENT].replica_states.get("RUNNING", 0)) if app else 0
    return None


def _memory_sample() -> dict:
    return {**cluster_rss_mb(), "running_replicas": running_replicas()}


async def collect_memory(stop: asyncio.Event, t0: float, interval_s: float = MEMORY_INTERVAL_S) -> list[dict]:
    samples = []
    while not stop.is_set():
        sample = await asyncio.to_thread(_memory_sample)
        samples.append({"t_s": round(time.monotonic() - t0, 2), **sample})
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)
    return samples


def _kill(replica_id: str, deployment: str = ENGINE_DEPLOYMENT) -> None:
    import ray

    actor = ray.get_actor(f"SERVE_REPLICA::{APP}#{deployment}#{replica_id}", namespace="serve")
    ray.kill(actor, no_restart=True)


def routable_replicas(deployment: str = ENGINE_DEPLOYMENT) -> set[str] | None:
    """Replicas Serve's controller counts as RUNNING: the list it pushes to the routers.

    Private API (the controller's `get_serve_instance_details`, what `serve status` and the
    dashboard read): the public `serve.status()` has only counts, which cannot tell a dead
    replica from one that finished starting at the same moment.
    """
    import ray
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    with contextlib.suppress(Exception):
        controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
        details = ray.get(controller.get_serve_instance_details.remote(), timeout=5)
        replicas = details["applications"][APP]["deployments"][deployment]["replicas"]
        return {r["replica_id"] for r in replicas if str(r["state"]).endswith("RUNNING")}
    return None


async def _dropped_by_controller_s(replica_id: str, killed_at: float, deployment: str = ENGINE_DEPLOYMENT,
                                   timeout_s: float = 60.0) -> float | None:
    """Seconds from the kill until the controller no longer lists the replica as running (routers
    follow that list), polled every 50 ms. None: still listed after `timeout_s`."""
    while time.monotonic() - killed_at < timeout_s:
        routable = await asyncio.to_thread(routable_replicas, deployment)
        if routable is not None and replica_id not in routable:
            return round(time.monotonic() - killed_at, 3)
        await asyncio.sleep(0.05)
    return None


async def _left_routers_s(http: httpx.AsyncClient, base: str, replica_id: str, killed_wall: float,
                          timeout_s: float = 30.0) -> dict[str, float | str | None]:
    """Per ingress replica: seconds from the kill until its router stopped routing to the replica
    (`pipeline.control.routing_exits`, shown in /v1/cluster); "never listed" for a router that did not list
    it (an ingress started after the kill); "ingress gone" for one that last answered listing it
    and then left the running ingresses (killed: its router went with it, when it let go is
    unknown); None for one still listing it after `timeout_s`. Polls /v1/cluster (the proxy spreads
    the polls over the ingress replicas) until every running ingress has answered with a float or
    "never listed", or the timeout."""
    left: dict[str, float | str | None] = {}
    deadline = time.monotonic() + timeout_s
    ingresses = ()
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
            routing = (await http.get(f"{base}/v1/cluster")).json()["routing"]
            exit_at = routing["exits"].get(replica_id)
            left[routing["ingress"]] = (round(exit_at - killed_wall, 3) if exit_at is not None else
                                        None if replica_id in routing["listed"] else "never listed")
        ingresses = await asyncio.to_thread(routable_replicas, INGRESS_DEPLOYMENT) or ()
        if ingresses and all(left.get(i) is not None for i in ingresses):
            break
        await asyncio.sleep(0.1)
    return {i: "ingress gone" if s is None and ingresses and i not in ingresses else s for i, s in left.items()}


async def kill_busiest_replica(http: httpx.AsyncClient, base: str, t0: float, deadline_s: float,
                               record: dict, not_before_s: float = 0.0) -> dict:
    """From `not_before_s` on, once two replicas report (or from `deadline_s` on, with one), kill the
    one holding the most sessions, then time how long until Serve's controller drops it. Runs until it
    has killed; the caller cancels it when the load ends first, and awaits it when `record` says the
    kill happened."""
    await asyncio.sleep(max(0.0, t0 + not_before_s - time.monotonic()))
    while True:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            replicas = (await http.get(f"{base}/v1/cluster")).json()["replicas"]
            elapsed = time.monotonic() - t0
            busiest = max(replicas.items(), key=lambda kv: len(kv[1]["sessions"]), default=None)
            if busiest and busiest[1]["sessions"] and (len(replicas) >= 2 or elapsed >= deadline_s):
                listed = busiest[0] in (await asyncio.to_thread(routable_replicas) or ())
                await asyncio.to_thread(_kill, busiest[0])
                killed_at, killed_wall = time.monotonic(), time.time()
                record.update(killed=True, replica_id=busiest[0], at_s=round(elapsed, 2),
                              replicas_reporting=len(replicas), sessions_on_victim=len(busiest[1]["sessions"]),
                              sessions=sorted(busiest[1]["sessions"]))
                # a victim not yet listed (still starting for Serve) was never routable: nothing to time
                if listed:
                    record["dropped_by_controller_s"], record["left_routers_s"] = await asyncio.gather(
                        _dropped_by_controller_s(busiest[0], killed_at),
                        _left_routers_s(http, base, busiest[0], killed_wall))
                else:
                    record["dropped_by_controller_s"] = None
                record["was_routable"] = listed
                return record
        await asyncio.sleep(0.25)


async def kill_an_ingress(t0: float, at_s: float, record: dict) -> dict:
    """At `at_s` into the load, kill one of the running ingress replicas (the proxy spreads streams
    over them, so some are mid-retrieval and some mid-answer on it); time until the controller drops
    it. Serve starts a replacement; the clients cut by the kill resume or ask again."""
    await asyncio.sleep(max(0.0, t0 + at_s - time.monotonic()))
    running = sorted(await asyncio.to_thread(routable_replicas, INGRESS_DEPLOYMENT) or ())
    if len(running) < 2:  # killing the only ingress would cut the whole HTTP side: not this drill
        return {"killed": False, "reason": f"{len(running)} ingress replica(s) running at {at_s} s"}
    victim = running[0]
    await asyncio.to_thread(_kill, victim, INGRESS_DEPLOYMENT)
    killed_at = time.monotonic()
    record.update(killed=True, replica_id=victim, at_s=round(killed_at - t0, 2), ingress_replicas=len(running))
    record["dropped_by_controller_s"] = await _dropped_by_controller_s(victim, killed_at, INGRESS_DEPLOYMENT)
    return record


async def drain(http: httpx.AsyncClient, base: str, idle_kv_blocks: int, timeout_s: float) -> dict:
    """After the load: until no replica, the central scheduler nor the ingress holds a session and
    KV use is back to its idle level; how long that took (or the state at the timeout)."""
    start = time.monotonic()
    state: dict = {}
    while time.monotonic() - start < timeout_s:
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
            view = (await http.get(f"{base}/v1/cluster")).json()
            health = (await http.get(f"{base}/healthz")).json()
            state = {"replica_sessions": sum(len(r["sessions"]) for r in view["replicas"].values()),
                     "scheduler_sessions": view["pressure"]["sessions"], "queued": view["pressure"]["queued"],
                     "ingress_sessions": health["sessions"], "kv_blocks_used": view["pressure"]["kv_blocks_used"],
                     "idle_kv_blocks": idle_kv_blocks,
                     "open_session_ids": sorted(s for r in view["replicas"].values() for s in r["sessions"])}
            if not (state["replica_sessions"] or state["scheduler_sessions"] or state["ingress_sessions"]
                    or state["queued"]) and state["kv_blocks_used"] <= idle_kv_blocks:
                return {**state, "drained": True, "drained_in_s": round(time.monotonic() - start, 2)}
        await asyncio.sleep(0.25)
    return {**state, "drained": False, "drained_in_s": None}
