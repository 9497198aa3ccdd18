"""A cluster launched by Ray, autoscaled under load: `python -m bench.cluster_launch` ->
bench/results/cluster_launch.json.

Ray's autoscaler (`fake_multinode` provider, bench/fake_cluster.py) runs cluster.yaml's node types on
this machine, GPUs counted as CPUs: the head (no CPU: Serve's controller, the HTTP proxy, the ingress,
the central scheduler), `gpu_worker` nodes of 1 CPU and `cpu_worker` nodes (the ingress nodes there; no
CPU here, so no replica goes to them), min_workers of each at start. The app is
deployed from a Serve config file with `serve deploy` (the tiny model), as cluster.yaml's head does
with deploy/serve.yaml. Client sessions then arrive faster than one engine replica's KV holds them:
Serve's autoscaling policy asks for a second replica, which fits on no running node, so Ray's
autoscaler launches a worker node and Serve places the replica there. Sessions hold their context
until then; the first to reach its question on each replica lingers through the scale-down. Then the
load ends: Serve goes back to one replica (the one it stops moves its open session to the other
before it stops: `pipeline.replica.drain`), the autoscaler removes the idle node after
`idle_timeout_minutes`, and the lingering sessions are answered. Figures: `nodes_launched` (worker
nodes started under load), `replicas_on_new_node`, `answered_on_new_node`, `lost` (sessions neither
answered nor refused with 429: must be 0), `moves` (the central scheduler's count of sessions
`moved` by a stopping replica, `move_failed`, `replayed` from scratch: must be 0), the node and
replica counts after the scale-down, a timeline. Exit status 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import yaml

from bench.fake_cluster import ROOT, fake_cluster, fake_cluster_config, free_port, load_cluster_yaml
from bench.results_meta import engine_dtype, start_run, write_results
from pipeline.control.home import CONTROL_RESOURCE

OUT = ROOT / "bench" / "results" / "cluster_launch.json"
SESSIONS = 12
ARRIVAL_GAP_S = 0.3
HOLD_AFTER_SCALE_S = 4.0
MAX_WAIT_S = 360.0   # a replica start on a new node of a loaded 2-core machine


def serve_yaml_retrievers(path: Path = ROOT / "deploy" / "serve.yaml") -> dict:
    """The retriever settings of the production Serve config (the one source of their placement)."""
    return yaml.safe_load(path.read_text())["applications"][0]["args"]["retrievers"]


APP_ARGS = {  # an AppConfig: the load of tests/test_pipeline_autoscale.py, one CPU per replica
    "model": {"model": "tiny", "dtype": "bfloat16", "max_model_len": 2048, "kv_cache_memory_bytes": 4 << 20},
    "replicas": {"min_replicas": 1, "max_replicas": 2, "num_cpus": 1.0, "report_interval_s": 0.5,
                 "upscale_delay_s": 1.0, "downscale_delay_s": 4.0, "target_kv_frac": 0.5,
                 "sessions_per_replica": 2.0, "drain_timeout_s": 30.0},
    "limits": {"max_queue": 4, "admission_timeout_s": 400.0, "session_ttl_s": 600.0, "max_context_tokens": 1900},
    "scheduler": {"demand_priors": {"client": 1536}, "stale_after_s": 3.0},
    # the ingress is placeable on any node; here it stays on the fake head (the control node), which
    # no scale-down removes, so the drill's client connections survive the node it removes
    "ingress": {"resources": {CONTROL_RESOURCE: 0.001}},
    # the retriever pools start with the ingress (the default) and go where deploy/serve.yaml puts
    # them, on the CPU workers (no CPU here: the fake cpu_worker has none); `--pools-anywhere` leaves
    # them to Ray's default placement instead, to show what that does to the scale-down
    "retrievers": {"warm_pools": True, "resources": serve_yaml_retrievers()["resources"]},
}


def app_args(pools_anywhere: bool = False) -> dict:
    if not pools_anywhere:
        return APP_ARGS
    return {**APP_ARGS, "retrievers": {"warm_pools": True}}


def serve_config(port: int, args: dict) -> dict:
    """The Serve config file deployed: deploy/serve.yaml's shape, this machine's settings."""
    return {"proxy_location": "HeadOnly",  # one HTTP port per machine: every fake node shares it
            "http_options": {"host": "127.0.0.1", "port": port},
            "applications": [{"name": "stream2llm", "route_prefix": "/", "import_path": "pipeline.app:app_builder",
                              "args": args}]}


def context(session: int) -> str:
    """~1,400 tokens, different per session (no shared prefix to be cached once)."""
    return " ".join(f"w{session}x{i % 97}" for i in range(300))


class Observer(threading.Thread):
    """Samples nodes (Ray's GCS), Serve's running replicas and the central scheduler's view."""

    def __init__(self, base: str):
        super().__init__(daemon=True)
        self.base, self.t0, self.stop = base, time.monotonic(), threading.Event()
        self.timeline: list[dict] = []
        self.replica_node: dict[str, str] = {}
        self.scaled = threading.Event()
        self.workers_at_start = worker_nodes()
        self.workers_seen = set(self.workers_at_start)

    def run(self):
        while not self.stop.is_set():
            with contextlib.suppress(Exception):
                self.sample()
            self.stop.wait(1.0)

    def sample(self):
        view = httpx.get(f"{self.base}/v1/cluster", timeout=10).json()
        for rid, report in view["replicas"].items():
            self.replica_node.setdefault(rid, report["node_id"])
        running, workers = running_replicas(), worker_nodes()
        self.workers_seen |= workers
        self.timeline.append({"t": round(time.monotonic() - self.t0, 1), "worker_nodes": len(workers),
                              "running_replicas": running, "reporting": len(view["replicas"]),
                              "sessions": view["pressure"]["sessions"], "queued": view["pressure"]["queued"]})
        if running >= 2 and view["pressure"]["replicas"] >= 2:
            self.scaled.set()

    def new_nodes(self) -> set[str]:
        return self.workers_seen - self.workers_at_start


def actors_by_node() -> dict[str, list[str]]:
    """The alive actors on each worker node (class names): what keeps a node from going idle."""
    from ray.util.state import list_actors

    workers = worker_nodes()
    out: dict[str, list[str]] = {node: [] for node in workers}
    for actor in list_actors(filters=[("state", "=", "ALIVE")], limit=10_000):
        if actor.node_id in workers:
            out[actor.node_id].append(actor.class_name)
    return {node: sorted(names) for node, names in out.items()}


def worker_nodes() -> set[str]:
    import ray

    return {n["NodeID"] for n in ray.nodes() if n["Alive"] and "node:__internal_head__" not in n["Resources"]}


def running_replicas() -> int:
    from ray import serve

    app = serve.status().applications.get("stream2llm")
    return int(app.deployments["EngineReplica"].replica_states.get("RUNNING", 0)) if app else 0


def one_session(base: str, out: list, i: int, obs: Observer, lingering: dict, released: threading.Event):
    with httpx.Client(base_url=base, timeout=MAX_WAIT_S + 60) as c:
        r = c.post("/v1/streams", json={"source_type": "client"})
        if r.status_code != 201:
            out[i] = ("rejected" if r.status_code == 429 else f"open {r.status_code}", None, None)
            return
        sid = r.json()["session_id"]
        r = c.post(f"/v1/streams/{sid}/chunks", json={"text": context(i), "source_id": f"s{i}"})
        if r.status_code != 200:
            out[i] = (f"append {r.status_code}", None, None)
            return
        obs.scaled.wait(MAX_WAIT_S)
        time.sleep(HOLD_AFTER_SCALE_S)
        replica = r.json()["replica_id"]
        if lingering.setdefault(replica, i) == i:  # the first on its replica lingers through the scale-down
            released.wait(MAX_WAIT_S)
        r = c.post(f"/v1/streams/{sid}/finish", json={"question": "Which word?", "sampling": {"max_tokens": 4}})
        final = final_event(r.text) if r.status_code == 200 else None
        if final is not None:
            out[i] = ("answered", final["node_id"], final["recovered"])
        else:
            out[i] = (f"finish {r.status_code}", None, r.text[-200:])


def final_event(sse: str) -> dict | None:
    """The data of the stream's last event when it is `final` (an answer), else None."""
    lines = sse.strip().split("\n\n")[-1].splitlines()
    if "event: final" not in lines:
        return None
    return json.loads(next(ln[len("data: "):] for ln in lines if ln.startswith("data: ")))


def wait_for(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if predicate():
                return True
        time.sleep(1.0)
    return False


def drive(base: str, min_workers: int) -> dict:
    obs = Observer(base)
    obs.start()
    results: list = [None] * SESSIONS
    lingering: dict[str, int] = {}
    released = threading.Event()
    threads = [threading.Thread(target=one_session, args=(base, results, i, obs, lingering, released))
               for i in range(SESSIONS)]
    for t in threads:
        t.start()
        time.sleep(ARRIVAL_GAP_S)
    wait_for(lambda: all(results[i] is not None or i in lingering.values() for i in range(SESSIONS)),
             MAX_WAIT_S + 120)
    load_end = time.monotonic() - obs.t0
    replicas_down = wait_for(lambda: running_replicas() == 1 and len(obs.timeline) and obs.timeline[-1]["reporting"] == 1,
                             240)
    released.set()
    for t in threads:
        t.join(timeout=MAX_WAIT_S)
    nodes_down = wait_for(lambda: len(worker_nodes()) == min_workers, 240)
    time.sleep(2.0)
    actors_after = actors_by_node()
    obs.stop.set()
    obs.join()
    new = obs.new_nodes()
    kinds = [r[0] if r else "lost" for r in results]
    view = httpx.get(f"{base}/v1/cluster", timeout=10).json()
    pressure = view["pressure"]
    return {
        "worker_nodes_at_start": len(obs.workers_at_start),
        "nodes_launched": len(new),
        "replicas_on_new_node": sum(node in new for node in obs.replica_node.values()),
        "answered_on_new_node": sum(r is not None and r[0] == "answered" and r[1] in new for r in results),
        "sessions": SESSIONS, "answered": kinds.count("answered"), "rejected": kinds.count("rejected"),
        "lost": sum(k not in ("answered", "rejected") for k in kinds),
        "lingering": {str(i): results[i] for i in lingering.values()},
        "recovered": sum(r is not None and r[0] == "answered" and bool(r[2]) for r in results),
        "moves": view["moves"],
        "scaled_back_replicas": replicas_down, "scaled_back_nodes": nodes_down,
        "worker_nodes_after": len(worker_nodes()), "running_replicas_after": running_replicas(),
        "actors_on_worker_nodes_after": {("new " if node in new else "") + node[-8:]: names
                                         for node, names in actors_after.items()},
        "sessions_after": pressure["sessions"], "queued_after": pressure["queued"],
        "load_end_s": round(load_end, 1), "failures": [r for r in results if r and r[0] not in ("answered", "rejected")],
        "timeline": obs.timeline,
    }


def targets_met(report: dict, min_workers: int) -> bool:
    return (report["nodes_launched"] >= 1 and report["replicas_on_new_node"] >= 1 and report["lost"] == 0
            and report["moves"]["replayed"] == 0
            and report["worker_nodes_after"] == min_workers and report["running_replicas_after"] == 1
            and report["sessions_after"] == 0)


def run(out: Path, pools_anywhere: bool = False) -> dict:
    """Launch, deploy, load, scale back; write the results file; return the report."""
    import ray

    config = fake_cluster_config(load_cluster_yaml())
    min_workers = sum(t.get("min_workers", 0) for t in config["available_node_types"].values())
    meta = start_run(model="tiny", dtype=engine_dtype(APP_ARGS["model"]["dtype"]), seeds=[])
    port = free_port()
    t0 = time.monotonic()
    with fake_cluster(config) as cluster:
        serve_file = cluster.log.parent / "serve.yaml"
        serve_file.write_text(yaml.safe_dump(serve_config(port, app_args(pools_anywhere))))
        subprocess.run([str(Path(sys.executable).parent / "serve"), "deploy", str(serve_file),
                        "--address", cluster.dashboard], check=True, timeout=120)
        ray.init(address=cluster.address, log_to_driver=False)
        try:
            base = f"http://127.0.0.1:{port}"
            if not wait_for(lambda: httpx.get(f"{base}/healthz", timeout=5).json()["replicas"] >= 1, MAX_WAIT_S):
                raise TimeoutError("the app did not come up")
            report = {"app_ready_s": round(time.monotonic() - t0, 1), **drive(base, min_workers)}
        finally:
            ray.shutdown()
    report = {"autoscaler_config": {k: config[k] for k in ("available_node_types", "max_workers", "idle_timeout_minutes")},
              "app_args": app_args(pools_anywhere), "targets_met": targets_met(report, min_workers), **report,
              "total_s": round(time.monotonic() - t0, 1)}
    write_results(out, report, meta)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--pools-anywhere", action="store_true",
                        help="retriever pools without serve.yaml's resources (Ray places them)")
    args = parser.parse_args(argv)
    report = run(args.out, args.pools_anywhere)
    print({k: v for k, v in report.items() if k not in ("timeline", "autoscaler_config", "app_args")})
    return 0 if report["targets_met"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
