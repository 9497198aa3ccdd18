"""A Ray cluster on this machine launched by Ray's own autoscaler (`fake_multinode` provider), its
node types taken from cluster.yaml: the autoscaling path of the real cluster without a cloud account.

    config = fake_cluster_config(load_cluster_yaml())          # pure: node types from cluster.yaml
    with fake_cluster(config) as cluster:                       # `ray start --head` with the config
        ...                                                     # workers come and go as Ray decides

cluster.yaml is the one source: each node type keeps its resources, min and max workers, with every
GPU counted as one CPU (an engine replica asks for `replicas.num_cpus` here where it asks for a GPU
there), and the head keeps its custom resources and no CPU, as it has no GPU there. Ray's
`AutoscalingCluster` helper wraps the same provider but reads an `example.yaml` the 2.60 wheel does
not ship. The fake provider starts worker nodes in the autoscaler's process tree (its monitor), and
they connect to the GCS on port 6379: one such cluster per machine at a time.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
FAKE_HEAD_TYPE = "ray.head.default"  # the node type name the fake provider gives its head node
GCS_PORT = 6379                      # where the fake provider's worker nodes look for the GCS
PROVIDER = {"type": "fake_multinode", "use_node_id_as_ip": True, "disable_node_updaters": True,
            "disable_launch_config_check": True}
_EMPTY = {"file_mounts": {}, "cluster_synced_files": [], "file_mounts_sync_continuously": False,
          "rsync_exclude": [], "rsync_filter": [], "initialization_commands": [], "setup_commands": [],
          "head_setup_commands": [], "worker_setup_commands": [], "head_start_ray_commands": [],
          "worker_start_ray_commands": [], "auth": {}}


def load_cluster_yaml(path: Path = ROOT / "cluster.yaml") -> dict:
    return yaml.safe_load(path.read_text())


def cpu_resources(resources: dict) -> dict:
    """A node type's resources with each GPU counted as a CPU (CPUs it declares are kept)."""
    out = {k: v for k, v in resources.items() if k != "GPU"}
    if resources.get("GPU"):
        out["CPU"] = out.get("CPU", 0) + resources["GPU"]
    return out


def fake_cluster_config(cluster: dict, *, max_workers_cap: int = 2, idle_timeout_minutes: float = 0.2) -> dict:
    """The autoscaler config of the fake cluster, built from cluster.yaml's node types."""
    head_type = cluster["head_node_type"]
    types = {}
    for name, spec in cluster["available_node_types"].items():
        resources = cpu_resources(spec.get("resources", {}))
        if name == head_type:
            types[FAKE_HEAD_TYPE] = {"resources": {**resources, "CPU": 0}, "node_config": {}, "max_workers": 0}
            continue
        top = min(spec.get("max_workers", cluster["max_workers"]), max_workers_cap)
        types[name] = {"resources": resources, "node_config": {}, "max_workers": top,
                       "min_workers": min(spec.get("min_workers", 0), top)}
    # the cap is per node type: a global one as low would leave no room above the min_workers of some
    return {**_EMPTY, "cluster_name": f"{cluster['cluster_name']}-fake", "provider": dict(PROVIDER),
            "max_workers": min(cluster["max_workers"], sum(t["max_workers"] for t in types.values())),
            "upscaling_speed": cluster.get("upscaling_speed", 1.0),
            "idle_timeout_minutes": idle_timeout_minutes, "available_node_types": types,
            "head_node_type": FAKE_HEAD_TYPE}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class FakeCluster:
    address: str
    dashboard: str
    head: subprocess.Popen
    log: Path


@contextlib.contextmanager
def fake_cluster(config: dict, *, update_interval_s: int = 1, start_timeout_s: float = 120.0):
    """`ray start --head --block` with the config, in a process group of its own; on exit every
    process of this cluster (the head's, the monitor's worker nodes) is stopped, and nothing else."""
    if port_in_use(GCS_PORT):
        raise RuntimeError(f"port {GCS_PORT} is taken: another Ray head runs here; the fake provider needs it")
    work = Path(tempfile.mkdtemp(prefix="stream2llm-fake-cluster-"))
    (work / "autoscaling.json").write_text(json.dumps(config))
    head_resources = {k: v for k, v in config["available_node_types"][FAKE_HEAD_TYPE]["resources"].items()
                      if k != "CPU"}
    dashboard = free_port()
    # Loopback only, one user: no token (a token in ~/.ray would turn it on, and `serve deploy` and
    # the driver would need it too). The caller's process gets the same setting.
    auth_before = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    env = {**os.environ, "RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": str(update_interval_s),
           "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    cmd = [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", f"--port={GCS_PORT}",
           "--num-cpus=0", f"--resources={json.dumps(head_resources)}",
           f"--autoscaling-config={work / 'autoscaling.json'}", "--include-dashboard=true",
           "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}", "--disable-usage-stats"]
    log = work / "head.log"
    with log.open("wb") as out:
        head = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    cluster = FakeCluster(f"127.0.0.1:{GCS_PORT}", f"http://127.0.0.1:{dashboard}", head, log)
    try:
        _wait_for_dashboard(cluster, start_timeout_s)
        yield cluster
    finally:
        stop(head)
        if auth_before is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = auth_before


def _wait_for_dashboard(cluster: FakeCluster, timeout_s: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cluster.head.poll() is not None:
            raise RuntimeError(f"ray start exited {cluster.head.returncode}: {cluster.log.read_text()[-2000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{cluster.dashboard}/api/version", timeout=5).status_code == 200:
                return
        time.sleep(1.0)
    raise TimeoutError(f"the head's dashboard did not answer within {timeout_s} s")


def stop(head: subprocess.Popen, grace_s: float = 20.0) -> None:
    """SIGTERM the head and every descendant (worker nodes included), SIGKILL what is left."""
    import psutil

    try:
        procs = [psutil.Process(head.pid), *psutil.Process(head.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        procs = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=10)
    with contextlib.suppress(subprocess.TimeoutExpired):
        head.wait(timeout=5)
    _forget_address()


def _forget_address() -> None:
    """Remove the "current cluster" file our `ray start` wrote, as `ray stop` does: a later
    `ray.init()` without an address reads it and takes this dead cluster for the one to join."""
    from ray._common.utils import get_ray_address_file, reset_ray_address

    path = Path(get_ray_address_file(None))
    with contextlib.suppress(OSError):
        if path.read_text().strip().endswith(f":{GCS_PORT}"):  # ours: we refuse to start if the port is taken
            reset_ray_address()
