"""bench.cluster_launch's pure parts: the fake cluster's autoscaler config is cluster.yaml's node types
(one source), GPUs counted as CPUs, valid for Ray's autoscaler; the targets can fail."""

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.cluster_launch import app_args, final_event, serve_config, serve_yaml_retrievers, targets_met
from bench.fake_cluster import FAKE_HEAD_TYPE, PROVIDER, cpu_resources, fake_cluster_config, load_cluster_yaml

ROOT = Path(__file__).resolve().parents[1]


def test_node_types_come_from_cluster_yaml_with_gpus_as_cpus():
    cluster = load_cluster_yaml()
    config = fake_cluster_config(cluster, max_workers_cap=2)
    types = config["available_node_types"]
    head = cluster["head_node_type"]
    assert config["head_node_type"] == FAKE_HEAD_TYPE and set(types) == {FAKE_HEAD_TYPE} | (
        set(cluster["available_node_types"]) - {head})
    assert types[FAKE_HEAD_TYPE]["resources"] == {**cluster["available_node_types"][head]["resources"], "CPU": 0}
    for name, spec in cluster["available_node_types"].items():
        if name == head:
            continue
        assert "GPU" not in types[name]["resources"]
        # a type without GPUs or declared CPUs (the ingress nodes) gets none: the fake provider's default is 0
        assert types[name]["resources"].get("CPU", 0) == spec["resources"].get("GPU", 0) + spec["resources"].get("CPU", 0)
        assert types[name]["min_workers"] == min(spec["min_workers"], 2)
        assert types[name]["max_workers"] == min(spec["max_workers"], 2)
    assert config["provider"] == PROVIDER
    assert config["max_workers"] == sum(t["max_workers"] for t in types.values())  # each type can reach its cap


def test_an_edit_of_cluster_yaml_reaches_the_fake_cluster():
    cluster = copy.deepcopy(load_cluster_yaml())
    cluster["available_node_types"]["gpu_worker"]["resources"] = {"GPU": 2, "engine_node": 1}
    cluster["available_node_types"]["gpu_worker"]["min_workers"] = 0
    types = fake_cluster_config(cluster)["available_node_types"]
    assert types["gpu_worker"]["resources"] == {"CPU": 2, "engine_node": 1}
    assert types["gpu_worker"]["min_workers"] == 0
    assert cpu_resources({"CPU": 4, "GPU": 1}) == {"CPU": 5}


def test_config_passes_rays_autoscaler_validation():
    from ray.autoscaler._private.util import validate_config

    validate_config(fake_cluster_config(load_cluster_yaml()))


def test_serve_config_file_is_valid_and_builds_the_app():
    from ray.serve.schema import ServeDeploySchema

    from pipeline.app import app_builder

    for pools_anywhere in (False, True):
        schema = ServeDeploySchema.model_validate(serve_config(8123, app_args(pools_anywhere)))
        assert schema.applications[0].import_path == "pipeline.app:app_builder"
        app_builder(dict(schema.applications[0].args))


def test_the_retriever_pools_go_where_the_production_serve_config_puts_them():
    retrievers = app_args()["retrievers"]
    assert retrievers["warm_pools"] and retrievers["resources"] == serve_yaml_retrievers()["resources"]
    assert "resources" not in app_args(pools_anywhere=True)["retrievers"]


def test_final_event_and_targets():
    sse = 'event: token\ndata: {"text": "a"}\n\nid: s.r.1\nevent: final\ndata: {"node_id": "n", "recovered": false}\n\n'
    assert final_event(sse) == {"node_id": "n", "recovered": False}
    assert final_event('event: error\ndata: {"error": "x"}\n\n') is None
    good = {"nodes_launched": 1, "replicas_on_new_node": 1, "lost": 0, "worker_nodes_after": 1,
            "running_replicas_after": 1, "sessions_after": 0, "moves": {"moved": 1, "replayed": 0}}
    assert targets_met(good, 1)
    for key, bad in (("nodes_launched", 0), ("replicas_on_new_node", 0), ("lost", 1), ("worker_nodes_after", 2),
                     ("moves", {"moved": 0, "replayed": 1})):
        assert not targets_met({**good, key: bad}, 1), key


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ray_autoscaler_launches_a_node_for_a_replica_and_removes_it(tmp_path):
    """The whole path, as `python -m bench.cluster_launch` runs it (~95 s here): a fake_multinode
    cluster from cluster.yaml, the app deployed from a Serve config file, a load that makes Serve ask
    for a second replica and Ray's autoscaler launch a node for it, then both scale back while
    sessions are open; every session answered or refused with 429. Needs port 6379 free. It runs in
    a process of its own: a driver of that cluster (which runs without Ray's token auth) leaves Ray's
    process-wide state behind, and the local clusters of later tests in this process failed to start."""
    out = tmp_path / "cluster_launch.json"
    done = subprocess.run([sys.executable, "-m", "bench.cluster_launch", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=840)
    assert out.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    summary = {k: v for k, v in report.items() if k not in ("timeline", "autoscaler_config", "app_args")}
    assert report["nodes_launched"] >= 1, summary
    assert report["replicas_on_new_node"] >= 1 and report["answered_on_new_node"] >= 1, summary
    assert report["lost"] == 0 and not report["failures"], summary
    # whether the queue overflows (429) before the new node's replica starts is the launch's speed,
    # not the code's: every session answered or refused, most answered
    assert report["answered"] >= 6 and report["answered"] + report["rejected"] == report["sessions"], summary
    assert len(report["lingering"]) == 2 and all(v[0] == "answered" for v in report["lingering"].values()), summary
    assert report["moves"]["replayed"] == 0 and report["moves"]["moved"] >= 1, summary  # drained, not replayed
    assert report["scaled_back_replicas"] and report["scaled_back_nodes"], summary
    assert report["targets_met"], summary
