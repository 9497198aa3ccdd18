"""A GCS restart loses no session: Ray's GCS fault tolerance with an external Redis (redis-server,
Debian's package), the app on a `ray.cluster_utils.Cluster` whose head keeps its GCS tables there.

The GCS is killed and started again (as a head pod restarted by KubeRay would be) between two
chunks of an open streaming session: the session's record (its shard), its replica and its KV, the
central actor and Serve's routing all carry on, so the session is answered on the replica that
held it, with both chunks, without a recovery. Needs `redis-server` on the PATH: CI installs it
(`.ci/run`), and there a missing one fails the test; elsewhere it is skipped, with that reason.
"""

import os
import shutil
import socket
import subprocess
import time

import httpx
import pytest
import ray

from pipeline_fixtures import parse_sse, serve_app, tiny_config, wait_until

pytestmark = [pytest.mark.timeout(600),
              pytest.mark.skipif(shutil.which("redis-server") is None and not os.environ.get("CI"),
                                 reason="needs redis-server (apt-get install redis-server) for GCS fault tolerance")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def redis_address():
    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: socket.socket().connect_ex(("127.0.0.1", port)) == 0, timeout=30)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_gcs_restart_loses_no_session(redis_address, monkeypatch):
    from ray.cluster_utils import Cluster

    monkeypatch.setenv("RAY_REDIS_ADDRESS", redis_address)  # read by the head node at start
    monkeypatch.setenv("RAY_external_storage_namespace", f"stream2llm-{free_port()}")
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": 1, "include_dashboard": False, "gcs_server_port": free_port()})
    config = tiny_config(replicas={"min_replicas": 1, "max_replicas": 1})
    try:
        with serve_app(config, address=cluster.address) as base:
            opened = httpx.post(f"{base}/v1/streams", json={}, timeout=60).json()
            sid = opened["session_id"]
            chunk = {"text": "before the restart: " + "alpha beta " * 15, "seq": 0}
            assert httpx.post(f"{base}/v1/streams/{sid}/chunks", json=chunk, timeout=60).status_code == 200
            scheduler = ray.get_actor("stream2llm_scheduler", namespace="stream2llm")
            started = ray.get(scheduler.ping.remote())["started_at"]

            cluster.head_node.kill_gcs_server()
            time.sleep(2)
            cluster.head_node.start_gcs_server()

            chunk = {"text": "after the restart: " + "gamma delta " * 15, "seq": 1}
            r = httpx.post(f"{base}/v1/streams/{sid}/chunks", json=chunk, timeout=120)
            assert r.status_code == 200 and r.json()["replica_id"] == opened["replica_id"], r.text
            r = httpx.post(f"{base}/v1/streams/{sid}/finish", json={"question": "q?", "sampling": {"max_tokens": 4}},
                           timeout=120)
            name, final = parse_sse(r.text)[-1]
            assert name == "final" and final["chunks"] == 2 and final["recovered"] is False, r.text
            assert ray.get(scheduler.ping.remote(), timeout=60)["started_at"] == started  # not restarted
    finally:
        cluster.shutdown()
