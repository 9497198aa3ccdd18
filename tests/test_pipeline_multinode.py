"""Multi-node on one machine (`ray.cluster_utils.Cluster`), cluster.yaml validation, bearer auth.

Head node: Serve controller and HTTP proxy (0 CPUs); the head is not the data plane.
A CPU node (0 CPUs here) advertises `cpu_node`, which the ingress replicas ask for, and the control
resource (`pipeline.control.home.CONTROL_RESOURCE`), which places the central scheduler actor and
the session records' shards there (by resource, not by node id).
Two worker nodes advertise the custom resource `engine_node`; each replica asks for one, so the
two replicas land on different nodes and every session's chunks cross nodes (ingress -> replica).
The last two tests remove a worker node each (its replica dies with it; the last one adds a node
first), so the file keeps its order in random-order runs.
"""

import json
import threading
import time
from pathlib import Path

import httpx
import pytest
import ray
import yaml

from pipeline.control.home import CONTROL_RESOURCE
from pipeline_fixtures import REPO, cluster_view, parse_sse, serve_app, tiny_config, wait_until

pytestmark = [pytest.mark.timeout(600), pytest.mark.random_order(disabled=True)]
TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def multinode():
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    cpu_node = cluster.add_node(num_cpus=0, resources={"cpu_node": 1, CONTROL_RESOURCE: 1})
    workers = [cluster.add_node(num_cpus=1, resources={"engine_node": 1}) for _ in range(2)]
    config = tiny_config(replicas={"resources": {"engine_node": 1}}, ingress={"resources": {"cpu_node": 0.001}},
                         auth={"bearer_tokens": [TOKEN]})
    try:
        with serve_app(config, address=cluster.address) as base:
            yield base, cluster, [w.node_id for w in workers], cpu_node.node_id
    finally:
        cluster.shutdown()


def test_replicas_on_worker_nodes_and_control_plane_placed_by_resource_off_the_head(multinode):
    base, cluster, worker_ids, cpu_node = multinode
    replicas = httpx.get(f"{base}/v1/cluster", headers=AUTH, timeout=30).json()["replicas"]
    nodes = sorted(r["node_id"] for r in replicas.values())
    assert nodes == sorted(worker_ids)
    scheduler = ray.get_actor("stream2llm_scheduler", namespace="stream2llm")
    assert ray.get(scheduler.ping.remote())["node_id"] == cpu_node != cluster.head_node.node_id
    from ray._private.state import actors  # the GCS's actor table (the state API needs the dashboard)

    ingress = [a for a in actors().values() if a["State"] == "ALIVE" and a["ActorClassName"].endswith(":Ingress")]
    assert ingress and {a["Address"]["NodeID"] for a in ingress} == {cpu_node}
    # the session records too: a worker node's removal must not take them along (a shard starts
    # with its first session)
    opened = httpx.post(f"{base}/v1/streams", json={}, headers=AUTH, timeout=60)
    assert opened.status_code == 201, opened.text
    shards = [a for a in actors().values() if a["State"] == "ALIVE" and a["ActorClassName"].endswith("SessionShard")]
    assert shards and {a["Address"]["NodeID"] for a in shards} == {cpu_node}, shards
    httpx.delete(f"{base}/v1/streams/{opened.json()['session_id']}", headers=AUTH, timeout=60)


def test_session_stream_crosses_nodes(multinode):
    base, cluster, worker_ids, _ = multinode
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
    base, _, _, _ = multinode
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
    assert any("scripts/setup.sh" in c for c in config["setup_commands"])
    assert any("serve deploy deploy/serve.yaml" in c for c in config["head_start_ray_commands"])
    raw["available_node_types"]["head"]["not_a_field"] = 1
    with pytest.raises(Exception, match="not_a_field"):
        validate_config(prepare_config(raw))


def test_cluster_yaml_ships_this_checkout_and_runs_real_files():
    """The mounts, set-up and start commands refer to files and commands that exist in this checkout."""
    import tomllib

    from stream2llm.cli import SUBCOMMANDS, _optional_subcommands

    raw = yaml.safe_load(Path(REPO, "cluster.yaml").read_text())
    mounts = raw["file_mounts"]
    assert list(mounts) == ["~/stream2llm"] and Path(REPO, mounts["~/stream2llm"]).resolve() == Path(REPO).resolve()
    setup = " && ".join(raw["setup_commands"])
    for script in ("scripts/setup.sh",):
        assert f" {script}" in setup and Path(REPO, script).stat().st_mode & 0o111  # present and executable
    assert "STREAM2LLM_EXTRAS=gpu" in setup
    pyproject = tomllib.loads(Path(REPO, "pyproject.toml").read_text())
    assert "gpu" in pyproject["project"]["optional-dependencies"]
    assert "3.11" in pyproject["project"]["requires-python"] and "python3.11" in setup
    assert any("python3.11" in c for c in raw["initialization_commands"])
    _optional_subcommands()
    starts = raw["head_start_ray_commands"] + raw["worker_start_ray_commands"]
    assert all(c.split()[0].startswith("~/stream2llm/.venv/bin/") for c in starts if "ray " in c)
    assert {"index", "serve", "prepare"} <= set(SUBCOMMANDS)
    assert any(".venv/bin/stream2llm index" in c for c in raw["setup_commands"])
    # the deployed settings (deploy/serve.yaml's app args): tests/test_cluster_setup.py
    gpu = raw["available_node_types"]["gpu_worker"]
    assert gpu["resources"]["GPU"] >= 1 and raw["available_node_types"]["head"]["resources"].get("GPU", 0) == 0


def test_worker_node_removed_mid_session_the_session_answers_on_the_other_node(multinode):
    """A node-removal drill: the session's context is replayed on the surviving node's replica and
    answered there; nothing already accepted is lost."""
    base, cluster, worker_ids, _ = multinode
    opened = httpx.post(f"{base}/v1/streams", json={}, headers=AUTH, timeout=60).json()
    sid, node = opened["session_id"], opened["node_id"]
    for i in range(2):
        r = httpx.post(f"{base}/v1/streams/{sid}/chunks", json={"text": f"fact {i}: " + "alpha beta " * 15},
                       headers=AUTH, timeout=60)
        assert r.status_code == 200, r.text
    cluster.remove_node(next(n for n in cluster.worker_nodes if n.node_id == node))
    r = httpx.post(f"{base}/v1/streams/{sid}/finish", json={"question": "q?", "sampling": {"max_tokens": 4}},
                   headers=AUTH, timeout=180)
    assert r.status_code == 200, r.text
    events = parse_sse(r.text)
    name, final = events[-1]
    assert name == "final", events
    survivor = next(w for w in worker_ids if w != node)
    assert final["node_id"] == survivor and final["recovered"] is True and final["chunks"] == 2


def test_worker_node_removed_under_load_every_session_is_answered_or_rejected(multinode):
    """A fresh worker node joins (Serve places the missing replica there), sessions spread over both
    nodes, and the node holding the most of them is removed while their answers stream: every
    session is answered (where it was, or recovered on the other node) or rejected with 429, none is
    lost, and no session or KV block is left behind."""
    base, cluster, _, cpu_node = multinode
    joined = cluster.add_node(num_cpus=1, resources={"engine_node": 1})
    nodes = {n.node_id for n in cluster.worker_nodes} - {cpu_node}
    wait_until(lambda: {r["node_id"] for r in cluster_view(base, AUTH)["replicas"].values()} == nodes, timeout=300)
    assert joined.node_id in nodes
    baseline_kv = sum(r["kv_blocks_used"] for r in cluster_view(base, AUTH)["replicas"].values())
    opened = []
    with httpx.Client(base_url=base, headers=AUTH, timeout=60) as c:
        for i in range(6):
            r = c.post("/v1/streams", json={})
            assert r.status_code in (201, 429), r.text
            if r.status_code == 201:
                sid, node = r.json()["session_id"], r.json()["node_id"]
                for k in range(2):
                    assert c.post(f"/v1/streams/{sid}/chunks", json={"text": f"s{i} fact {k}: " + "gamma " * 30}
                                  ).status_code == 200
                opened.append((sid, node))
    assert opened
    victim = max(nodes, key=lambda n: sum(node == n for _, node in opened))
    on_victim = {sid for sid, node in opened if node == victim}
    outcomes: dict[str, tuple] = {}
    started: dict[str, float] = {}  # session -> when its first answer token reached the client
    threads = [threading.Thread(target=_finish, args=(base, sid, outcomes, started)) for sid, _ in opened]
    for t in threads:
        t.start()
    # the node goes while an answer on it streams: one has begun and has not ended
    under_way = wait_until(lambda: {s for s in on_victim if s in started and s not in outcomes}, timeout=120,
                           interval=0.02)
    cluster.remove_node(next(n for n in cluster.worker_nodes if n.node_id == victim))
    for t in threads:
        t.join(timeout=300)
    assert len(outcomes) == len(opened), outcomes
    for sid, node in opened:
        kind, final = outcomes[sid]
        assert kind in ("answered", 429), (sid, node, outcomes[sid])
        if kind == 429:  # refused for room, as a client can act on: when to retry, and why
            assert node == victim and final["retry_after"] >= 1 and final["reason"], final
        if kind == "answered":
            assert final["chunks"] == 2 and final["output_tokens"] >= 1, final
            assert final["node_id"] == node or final["recovered"] is True, final
    assert sum(kind == "answered" for kind, _ in outcomes.values()) >= sum(node != victim for _, node in opened)
    print("node removed under load:", {"on_victim": len(on_victim), "under_way": len(under_way), "sessions": len(opened),
          "recovered": sum(kind == "answered" and f["recovered"] for kind, f in outcomes.values()),
          "outcomes": [kind for kind, _ in outcomes.values()]})
    wait_until(lambda: cluster_view(base, AUTH)["pressure"]["sessions"] == 0, timeout=60)
    wait_until(lambda: sum(r["kv_blocks_used"] for r in cluster_view(base, AUTH)["replicas"].values()) <= baseline_kv,
               timeout=60)


def _finish(base: str, sid: str, outcomes: dict, started: dict) -> None:
    """The answer, read as it streams (`started[sid]`: when its first token came), into `outcomes`.
    Greedy, so an answer cut by its replica's death resumes on another replica."""
    body = ""
    with httpx.stream("POST", f"{base}/v1/streams/{sid}/finish", headers=AUTH, timeout=180,
                      json={"question": "q?", "sampling": {"max_tokens": 96, "temperature": 0.0}}) as r:
        for piece in r.iter_text():
            body += piece
            if sid not in started and "event: token" in body:
                started[sid] = time.monotonic()
    events = parse_sse(body) if r.status_code == 200 else []
    if events and events[-1][0] == "final":
        outcomes[sid] = ("answered", events[-1][1])
    elif r.status_code == 429:
        outcomes[sid] = (429, {"retry_after": int(r.headers.get("Retry-After", 0)),
                               "reason": json.loads(body).get("reason")})
    else:
        outcomes[sid] = (r.status_code, body[-400:])
