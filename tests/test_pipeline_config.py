"""Config, builder and autoscaling-policy logic (no Ray cluster needed)."""

import argparse
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from engine.config import EngineConfig
from pipeline.control.autoscale import KVPressurePolicy, autoscaling_config
from pipeline.config import AppConfig, load_config
from pipeline.errors import LimitExceeded, NeverFits


def test_defaults_are_local_cpu_smollm2_and_the_engine_config_is_embedded():
    c = AppConfig()
    assert c.model.model == "smollm2" and c.retrievers.crawler_site == "local"
    opts = c.placement().deployment_options()
    assert opts["ray_actor_options"]["num_gpus"] == 0 and opts["ray_actor_options"]["num_cpus"] == 1.0
    assert opts["ray_actor_options"]["runtime_env"]["env_vars"]["OMP_NUM_THREADS"] == "1"
    assert "placement_group_bundles" not in opts
    assert c.engine_config() == EngineConfig()  # the same class and defaults, not a mirror


def test_a_cpu_replica_of_several_cpus_runs_as_vllm_serve_does():
    env = AppConfig.model_validate({"replicas": {"num_cpus": 2}}).placement().ray_actor_options["runtime_env"]
    # vLLM's "mp" executor and its own thread set-up; no single-thread override
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in env["env_vars"] and "OMP_NUM_THREADS" not in env["env_vars"]
    one = AppConfig.model_validate({"replicas": {"num_cpus": 1.5}}).placement().ray_actor_options["runtime_env"]
    assert one["env_vars"]["OMP_NUM_THREADS"] == "1" and one["env_vars"]["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert env["env_vars"]["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"  # every core pinned, as `vllm serve`
    kept = AppConfig.model_validate({"replicas": {"num_cpus": 4, "cpu_reserved_cores": 1}}).placement()
    assert kept.ray_actor_options["runtime_env"]["env_vars"]["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "1"


def test_engine_section_round_trips_through_json_as_the_replica_receives_it():
    c = AppConfig.model_validate({"model": {"model": "tiny", "tensor_parallel_size": 1, "block_size": 64}})
    again = AppConfig.model_validate(c.model_dump(mode="json"))
    assert again.engine_config() == c.engine_config() and again.model.block_size == 64


def test_one_gpu_replica_asks_one_gpu_and_no_cpu_env():
    c = AppConfig.model_validate({"replicas": {"use_gpu": True, "resources": {"engine_node": 1}}})
    opts = c.placement().deployment_options()["ray_actor_options"]
    assert opts["num_gpus"] == 1 and opts["resources"] == {"engine_node": 1} and "runtime_env" not in opts


def test_tensor_parallel_replica_gets_one_bundle_per_gpu_and_the_ray_executor():
    c = AppConfig.model_validate({"replicas": {"use_gpu": True, "num_cpus": 2, "resources": {"gpu_node": 1}},
                                  "model": {"tensor_parallel_size": 2, "pipeline_parallel_size": 2}})
    opts = c.placement().deployment_options()
    assert opts["placement_group_bundles"] == [{"CPU": 2, "GPU": 1, "gpu_node": 1}, {"GPU": 1}, {"GPU": 1},
                                               {"GPU": 1}]
    assert opts["placement_group_strategy"] == "STRICT_PACK"
    # the replica actor sits in bundle 0 and holds no GPU itself: vLLM's workers take them
    assert opts["ray_actor_options"] == {"num_cpus": 2, "num_gpus": 0, "resources": {"gpu_node": 1}}
    assert c.engine_config().distributed_executor_backend == "ray"
    assert c.model.distributed_executor_backend is None  # the user's section is left as written


@pytest.mark.parametrize("bad", [
    {"replicas": {"use_gpu": True}, "model": {"tensor_parallel_size": 2, "distributed_executor_backend": "mp"}},
    {"replicas": {"use_gpu": True}, "model": {"platform": "cpu"}},
    {"replicas": {"use_gpu": False}, "model": {"platform": "cuda"}},
    {"replicas": {"use_gpu": True, "placement_strategy": "ANYWHERE"}, "model": {"tensor_parallel_size": 2}},
    {"model": {"tensor_parallel_size": 0}},
    {"replicas": {"num_cpus": 1, "cpu_reserved_cores": 1}},  # one unpinned thread: nothing to reserve
    {"replicas": {"num_cpus": 2, "cpu_reserved_cores": 2}},  # no core left to the model
    {"replicas": {"use_gpu": True, "cpu_reserved_cores": 1}},  # a CPU-engine setting on a GPU replica
    {"model": {"gpu_memory_utilization": 1.5}},
    {"model": {"unknown_engine_field": 1}},
])
def test_contradictory_placement_is_rejected_at_load_time(bad):
    with pytest.raises(ValidationError):
        AppConfig.model_validate(bad)


def test_vector_actor_gpu_share_is_accounted_by_ray():
    cpu = AppConfig().retrievers
    assert cpu.vector_actor_options()["num_gpus"] == 0 and not cpu.vector_on_gpu
    gpu = AppConfig.model_validate({"retrievers": {"vector_num_gpus": 0.25}}).retrievers
    assert gpu.vector_actor_options()["num_gpus"] == 0.25 and gpu.vector_on_gpu


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


def test_one_context_ceiling_and_one_answer_budget_from_the_engine():
    config = AppConfig.model_validate({"model": {"max_model_len": 4096, "answer_budget_tokens": 256}})
    assert config.context_limit == 4096 - 256 == config.model.context_limit
    capped = AppConfig.model_validate({"model": {"max_model_len": 4096}, "limits": {"max_context_tokens": 1000}})
    assert capped.context_limit == 1000
    with pytest.raises(ValidationError, match="model.context_limit"):
        AppConfig.model_validate({"model": {"max_model_len": 4096}, "limits": {"max_context_tokens": 4000}})
    config.check_answer_length(256)
    with pytest.raises(LimitExceeded, match="answer budget of 256"):
        config.check_answer_length(257)
    with pytest.raises(NeverFits, match="model's length of 4096") as e:  # no context could make it fit
        config.check_answer_length(4096)
    assert e.value.status == 400


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
    assert cfg["policy"]["policy_function"] == "pipeline.control.autoscale:KVPressurePolicy"
    from ray.serve.config import AutoscalingConfig

    AutoscalingConfig(**cfg)  # Serve's own validation accepts it


def _ctx(current, kv, cluster=0.0, queued=0, lo=1, hi=4):
    per = lambda v: {f"r{i}": v for i in range(current)}  # noqa: E731
    return SimpleNamespace(
        current_num_replicas=current, capacity_adjusted_min_replicas=lo, capacity_adjusted_max_replicas=hi,
        aggregated_metrics={"kv_used_frac": per(kv), "cluster_load_frac": per(cluster),
                            "cluster_queued": per(queued)})


def test_kv_pressure_policy_scales_on_kv_and_queue():
    policy = KVPressurePolicy(target_kv_frac=0.5, sessions_per_replica=2)
    assert policy(_ctx(2, kv=0.9))[0] == 4
    assert policy(_ctx(2, kv=0.1))[0] == 1
    assert policy(_ctx(1, kv=0.2, cluster=0.45, queued=3))[0] == 3
    assert policy(_ctx(2, kv=0.5))[0] == 2


def test_app_builder_accepts_serve_style_args():
    from ray.serve.deployment import Application

    from pipeline.app import app_builder

    app = app_builder({"model.model": "tiny", "replicas.max_replicas": "2", "replicas.min_replicas": "1"})
    assert isinstance(app, Application)
    with pytest.raises(ValidationError):
        app_builder({"model.nonsense": "1"})


def test_cli_serve_print_config(capsys):
    from pipeline.run import serve as cli_serve

    parser = argparse.ArgumentParser()
    cli_serve.add_arguments(parser)
    args = parser.parse_args(["--set", "model.model=tiny", "--print-config"])
    assert cli_serve.run(args) == 0
    assert '"model": "tiny"' in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli_serve.parse_overrides(["novalue"])


def test_both_deployments_run_serve_user_code_and_routers_on_the_main_loop():
    from pipeline.app import SERVE_LOOP_ENV, engine_deployment, ingress_deployment

    c = AppConfig()
    engine_env = engine_deployment(c).ray_actor_options["runtime_env"]["env_vars"]
    assert engine_env["OMP_NUM_THREADS"] == "1"  # the CPU engine's own env is kept
    for deployment in (engine_deployment(c), ingress_deployment(c)):
        env = deployment.ray_actor_options["runtime_env"]["env_vars"]
        assert {k: env[k] for k in SERVE_LOOP_ENV} == {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
                                                       "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0"}
