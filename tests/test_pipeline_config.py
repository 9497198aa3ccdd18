"""Config, builder and autoscaling-policy logic (no Ray cluster needed)."""

import argparse
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from engine.config import EngineConfig
from pipeline.autoscale import KVPressurePolicy, autoscaling_config
from pipeline.config import AppConfig, load_config


def test_defaults_are_local_cpu_smollm2_and_convert_to_engine_config():
    c = AppConfig()
    assert c.model.model == "smollm2" and c.retrievers.crawler_site == "local"
    opts = c.replicas.actor_options()
    assert opts["num_gpus"] == 0 and opts["num_cpus"] == 1.0
    assert opts["runtime_env"]["env_vars"]["OMP_NUM_THREADS"] == "1"
    e = c.engine_config()
    assert isinstance(e, EngineConfig) and e.block_size == EngineConfig().block_size


def test_gpu_replicas_ask_one_gpu_and_no_cpu_env():
    c = AppConfig.model_validate({"replicas": {"use_gpu": True, "resources": {"engine_node": 1}}})
    opts = c.replicas.actor_options()
    assert opts["num_gpus"] == 1 and opts["resources"] == {"engine_node": 1} and "runtime_env" not in opts


@pytest.mark.parametrize("bad", [
    {"replicas": {"min_replicas": 3, "max_replicas": 2}},
    {"replicas": {"min_replicas": 1, "max_replicas": 2, "initial_replicas": 5}},
    {"model": {"max_model_len": "long"}},
    {"limits": {"session_ttl_s": 0}},
    {"unknown_section": {}},
])
def test_bad_config_is_rejected(bad):
    with pytest.raises(ValidationError):
        AppConfig.model_validate(bad)


def test_load_config_file_and_dotted_overrides(tmp_path):
    path = tmp_path / "app.yaml"
    path.write_text("model:\n  model: tiny\nlimits:\n  max_queue: 3\n")
    c = load_config(str(path), {"limits.max_queue": 5, "replicas.max_replicas": 2})
    assert (c.model.model, c.limits.max_queue, c.replicas.max_replicas) == ("tiny", 5, 2)


def test_autoscaling_config_only_when_bounds_differ():
    fixed = AppConfig().replicas
    assert autoscaling_config(fixed) is None
    scaled = AppConfig.model_validate({"replicas": {"min_replicas": 1, "max_replicas": 3}}).replicas
    cfg = autoscaling_config(scaled)
    assert cfg["policy"]["policy_function"] == "pipeline.autoscale:KVPressurePolicy"
    from ray.serve.config import AutoscalingConfig

    AutoscalingConfig(**cfg)  # Serve's own validation accepts it


def _ctx(current, kv, cluster=0.0, queued=0, lo=1, hi=4):
    per = lambda v: {f"r{i}": v for i in range(current)}  # noqa: E731
    return SimpleNamespace(
        current_num_replicas=current, capacity_adjusted_min_replicas=lo, capacity_adjusted_max_replicas=hi,
        aggregated_metrics={"kv_used_frac": per(kv), "cluster_projected_frac": per(cluster),
                            "cluster_queued": per(queued)})


def test_kv_pressure_policy_scales_on_kv_and_queue():
    policy = KVPressurePolicy(target_kv_frac=0.5, sessions_per_replica=2)
    assert policy(_ctx(2, kv=0.9))[0] == 4
    assert policy(_ctx(2, kv=0.1))[0] == 1
    assert policy(_ctx(1, kv=0.2, cluster=0.45, queued=3))[0] == 3
    assert policy(_ctx(2, kv=0.5))[0] == 2


def test_app_builder_accepts_serve_style_args():
    from ray.serve._private.build_app import BuiltApplication  # noqa: F401  (Serve is importable)
    from ray.serve.deployment import Application

    from pipeline.app import app_builder

    app = app_builder({"model.model": "tiny", "replicas.max_replicas": "2", "replicas.min_replicas": "1"})
    assert isinstance(app, Application)
    with pytest.raises(ValidationError):
        app_builder({"model.nonsense": "1"})


def test_cli_serve_print_config(capsys):
    from pipeline import cli_serve

    parser = argparse.ArgumentParser()
    cli_serve.add_arguments(parser)
    args = parser.parse_args(["--set", "model.model=tiny", "--print-config"])
    assert cli_serve.run(args) == 0
    assert '"model": "tiny"' in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli_serve.parse_overrides(["novalue"])
