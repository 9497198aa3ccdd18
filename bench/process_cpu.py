"""CPU seconds per process role over a measured interval: where a server's CPU went.

    before = snapshot(); ...run...; cpu = cpu_by_role(before, snapshot())

Every process on the machine is counted (a shared machine's other work shows as `other`), by the
role its command line names (Ray and vLLM set process titles: `ray::ServeController`,
`VLLM::EngineCore`; a Ray worker's title becomes its actor's). A process alive at both snapshots
counts its difference; one started in between counts all of its CPU; one that exited in between is
not counted (a benchmark client run as a subprocess, for one, is counted only while it lives).
"""

from __future__ import annotations

import contextlib

import psutil

# (role, substrings of the command line), first match wins: vLLM's processes before Ray's, as a
# vLLM engine core started by a Ray actor carries both in its environment but its own title.
ROLES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("vllm_worker", ("VLLM::Worker",)),
    ("vllm_engine_core", ("VLLM::EngineCore",)),
    ("vllm_api_server", ("engine.vllm_cli serve", "vllm serve", "VLLM::APIServer")),
    ("bench_client", ("bench serve",)),
    ("engine_replica", ("ServeReplica:stream2llm:EngineReplica",)),
    ("ingress", ("ServeReplica:stream2llm:Ingress",)),
    ("serve_proxy", ("ProxyActor",)),
    ("serve_controller", ("ServeController",)),
    ("central_scheduler", ("ray::CentralScheduler",)),
    ("session_shards", ("ray::SessionShard",)),
    ("retriever_actors", ("ray::CrawlerActor", "ray::LocalSiteActor", "ray::VectorActor")),
    ("ray_gcs", ("gcs_server",)),
    ("raylet", ("raylet/raylet",)),  # its binary: other processes name its socket in their arguments
    ("ray_dashboard", ("dashboard",)),  # the head's dashboard; its per-node agent is `ray::DashboardAgent`
    ("ray_idle_workers", ("ray::IDLE",)),
    ("ray_other", ("ray::", "/ray/", "ray start")),  # agents, monitors, other actors
)


def role_of(cmdline: str) -> str:
    for role, marks in ROLES:
        if any(mark in cmdline for mark in marks):
            return role
    return "other"


def snapshot() -> dict[int, tuple[str, float]]:
    """pid -> (role, CPU seconds so far, user + system) of every process readable now."""
    out = {}
    for proc in psutil.process_iter(["cmdline", "cpu_times"]):
        with contextlib.suppress(psutil.Error, TypeError):
            times = proc.info["cpu_times"]
            out[proc.pid] = (role_of(" ".join(proc.info["cmdline"] or ())), times.user + times.system)
    return out


def cpu_by_role(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds per role between two snapshots, to /proc's 10 ms, largest first (see module doc)."""
    totals: dict[str, float] = {}
    for pid, (role, cpu) in after.items():
        earlier = before.get(pid)
        spent = cpu - earlier[1] if earlier is not None else cpu  # under its role now
        totals[role] = totals.get(role, 0.0) + max(spent, 0.0)
    return dict(sorted(((r, round(s, 2)) for r, s in totals.items()), key=lambda kv: -kv[1]))
