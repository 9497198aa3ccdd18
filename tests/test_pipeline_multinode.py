"""Multi-node on one machine (`ray.cluster_utils.Cluster`), cluster.yaml validation, bearer auth.

Head node: Serve controller, HTTP proxy, ingress and the central scheduler actor (0 CPUs).
Two worker nodes advertise the custom resource `engine_node`; each replica asks for one, so the
two replicas land on different nodes and every session's chunks cross nodes (ingress -> replica).
"""

from pathlib import Path

import httpx
import pytest
import ray
import yaml

from pipeline_fixtures import REPO, cluster_view, parse_sse, serve_app, tiny_config

pytestmark = pytest.mark.timeout(600)
TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def multinode():
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    workers = [cluster.add_node(num_cpus=1, resources={"engine_node": 1}) for _ in range(2)]
    config = tiny_config(replicas={"resources": {"engine_node": 1}}, auth={"bearer_tokens": [TOKEN]})
    try:
        with serve_app(config, address=cluster.address) as base:
            yield base, cluster, [w.node_id for w in workers]
    finally:
        cluster.shutdown()


def test_replicas_on_different_worker_nodes_and_scheduler_on_head(multinode):
    base, cluster, worker_ids = multinode
    replicas = httpx.get(f"{base}/v1/cluster", headers=AUTH, timeout=30).json()["replicas"]
    nodes = sorted(r["node_id"] for r in replicas.values())
    assert nodes == sorted(worker_ids)
    scheduler = ray.get_actor("stream2llm_scheduler", namespace="stream2llm")
    assert ray.get(scheduler.ping.remote())["node_id"] == cluster.head_node.node_id


def test_session_stream_crosses_nodes(multinode):
    base, cluster, worker_ids = multinode
    opened = httpx.post(f"{base}/v1/streams", json={}, headers=AUTH, timeout=60).json()
    assert opened["node_id"] in worker_ids and opened["node_id"] != cluster.head_node.node_id
    sid = opened["session_id"]
    for i in range(3):
        r = httpx.post(f"{base}/v1/streams/{sid}/chunks", json={"text": f"chunk {i} " * 20},
                       headers=AUTH, timeout=60)
        assert r.status_code == 200 and r.json()["node_id"] == opened["node_id"]  # affinity
    r = httpx.post(f"{base}/v1/streams/{sid}/finish", json={"question": "q?", "sampling": {"max_tokens": 4}},
                   headers=AUTH, timeout=60)
    final = parse_sse(r.text)[-1][1]
    assert final["node_id"] == opened["node_id"] and final["chunks"] == 3


def test_bearer_token_auth(multinode):
    base, _, _ = multinode
    assert httpx.get(f"{base}/healthz").status_code == 200  # health stays public
    r = httpx.get(f"{base}/v1/models")
    assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer"
    assert httpx.get(f"{base}/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.get(f"{base}/v1/models", headers=AUTH).status_code == 200


def test_cluster_yaml_passes_rays_own_validation():
    from ray.autoscaler._private.commands import prepare_config
    from ray.autoscaler._private.util import validate_config

    raw = yaml.safe_load(Path(REPO, "cluster.yaml").read_text())
    config = prepare_config(raw)
    validate_config(config)
    assert config["available_node_types"]["gpu_worker"]["resources"]["GPU"] == 1
    assert any("stream2llm[gpu" in c for c in config["setup_commands"])
    assert any("stream2llm serve" in c for c in config["head_start_ray_commands"])
    raw["available_node_types"]["head"]["not_a_field"] = 1
    with pytest.raises(Exception, match="not_a_field"):
        validate_config(prepare_config(raw))
