"""Where an engine replica runs: Ray actor options and, for multi-GPU replicas, placement bundles.

Pure (no Ray calls): `replica_placement` turns the replica settings and the engine config into what
the Serve deployment receives, so the bundles are unit-tested on a CPU machine.

- CPU replica: the actor asks for `num_cpus` and no GPU; one CPU: one OpenMP thread, vLLM's "uni"
  executor; more: vLLM's "mp" executor and thread set-up, as `vllm serve` runs (`cpu_engine_env`).
- One-GPU replica (tensor x pipeline parallel = 1): the actor asks for one GPU; Ray sets its
  CUDA_VISIBLE_DEVICES and vLLM runs its single worker there.
- Multi-GPU replica (TP x PP = N > 1), the way Ray Serve LLM places one: a placement group of N
  bundles of one GPU each; the replica actor lives in bundle 0 (its CPUs and custom resources are
  added there) and asks for no GPU itself; vLLM's "ray" executor starts one worker per bundle of
  the replica's placement group. STRICT_PACK keeps a tensor-parallel group on one node.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from engine.config import EngineConfig, EngineConfigError

# Measured on 2 cores: one OpenMP thread per process; with V1 multiprocessing off, vLLM keeps the
# requested "uni" executor instead of its CPU platform's switch to "mp".
CPU_ENGINE_ENV = {"OMP_NUM_THREADS": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                  "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
PLACEMENT_STRATEGIES = ("STRICT_PACK", "PACK", "SPREAD", "STRICT_SPREAD")


def cpu_engine_env(num_cpus: float, reserved_cores: int = 0) -> dict:
    """The replica's environment. One CPU: the "uni" executor and one OpenMP thread (above). Two or
    more: what `vllm serve` runs on CPU, vLLM's "mp" executor (the model in a worker process, the
    scheduler beside it) with vLLM's own thread set-up: a pinned thread per core of the node but for
    `reserved_cores`, which are left to the processes beside the model. Always set, so that vLLM's own
    default (one core per worker on x86) never decides. bench.vs_vllm_serve gives `vllm serve` this
    environment too.
    """
    if num_cpus < 2:
        if reserved_cores:
            raise EngineConfigError("replicas.cpu_reserved_cores needs a CPU replica of num_cpus >= 2 (one CPU "
                                    "runs a single unpinned OpenMP thread: nothing to reserve)")
        return dict(CPU_ENGINE_ENV)
    if reserved_cores >= num_cpus:
        raise EngineConfigError(f"replicas.cpu_reserved_cores ({reserved_cores}) leaves the model no core of "
                                f"the replica's {num_cpus:g}")
    return {"VLLM_CPU_NUM_OF_RESERVED_CPU": str(reserved_cores)}


@dataclass(frozen=True)
class ReplicaPlacement:
    """What the engine deployment is given: actor options, optional bundles, the engine config."""

    ray_actor_options: dict
    placement_group_bundles: list[dict] | None
    placement_group_strategy: str | None
    engine: EngineConfig

    def deployment_options(self) -> dict:
        options = {"ray_actor_options": self.ray_actor_options}
        if self.placement_group_bundles is not None:
            options["placement_group_bundles"] = self.placement_group_bundles
            options["placement_group_strategy"] = self.placement_group_strategy
        return options


def replica_placement(engine: EngineConfig, *, use_gpu: bool, num_cpus: float, resources: dict,
                      strategy: str = "STRICT_PACK", cpu_reserved_cores: int = 0) -> ReplicaPlacement:
    """Placement of one engine replica; contradictory settings raise EngineConfigError."""
    if strategy not in PLACEMENT_STRATEGIES:
        raise EngineConfigError(f"placement strategy must be one of {PLACEMENT_STRATEGIES}, got {strategy!r}")
    if not use_gpu:
        if engine.platform == "cuda":
            raise EngineConfigError("engine platform 'cuda' needs replicas.use_gpu = true")
        if engine.num_devices > 1 and engine.distributed_executor_backend in (None, "uni"):
            raise EngineConfigError("a CPU replica with tensor/pipeline parallelism needs "
                                    "distributed_executor_backend 'mp'")
        env = cpu_engine_env(num_cpus, cpu_reserved_cores)
        options = {"num_cpus": num_cpus, "num_gpus": 0, "runtime_env": {"env_vars": env}}
        return ReplicaPlacement(_with_resources(options, resources), None, None, engine)
    if engine.platform == "cpu":
        raise EngineConfigError("replicas.use_gpu = true contradicts engine platform 'cpu'")
    if cpu_reserved_cores:
        raise EngineConfigError("replicas.cpu_reserved_cores applies to CPU replicas (use_gpu = false)")
    if engine.num_devices == 1:
        options = _with_resources({"num_cpus": num_cpus, "num_gpus": 1}, resources)
        return ReplicaPlacement(options, None, None, engine)
    backend = engine.distributed_executor_backend
    if backend not in (None, "ray"):
        raise EngineConfigError(f"a {engine.num_devices}-GPU replica runs its workers in its placement "
                                f"group with the 'ray' executor, not {backend!r}")
    first = {"CPU": num_cpus, "GPU": 1, **resources}
    bundles = [first] + [{"GPU": 1} for _ in range(engine.num_devices - 1)]
    options = _with_resources({"num_cpus": num_cpus, "num_gpus": 0}, resources)
    return ReplicaPlacement(options, bundles, strategy, replace(engine, distributed_executor_backend="ray"))


def _with_resources(options: dict, resources: dict) -> dict:
    if resources:
        options["resources"] = dict(resources)
    return options
