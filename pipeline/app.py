"""Build the Ray Serve application from one `AppConfig`.

    from pipeline.app import build_app
    serve.run(build_app(AppConfig()), name="stream2llm")

Serve config files / CLI use the import path with arguments (an `AppConfig` as a dict; unknown
keys are rejected):

    serve run pipeline.app:app_builder model.model=tiny          # dotted overrides
    # or in a Serve config file:  import_path: pipeline.app:app_builder, args: {model: {model: tiny}}
"""

from __future__ import annotations

from ray import serve
from ray.serve.config import RequestRouterConfig

from pipeline.control.autoscale import autoscaling_config
from pipeline.config import AppConfig, load_config
from pipeline.ingress.deployment import IngressRoutes, api
from pipeline.replica.deployment import EngineReplica
from pipeline.control.router import AffinityRouter

ENGINE_DEPLOYMENT = "EngineReplica"
INGRESS_DEPLOYMENT = "Ingress"

# Serve runs user code and a handle's router each on a thread of its own by default, so every
# streamed piece (one per token) crosses Python threads, waiting for the GIL at each crossing (up to
# its 5 ms switch interval while another thread runs). On the main loop instead, as Ray's
# RAY_SERVE_THROUGHPUT_OPTIMIZED sets them; our code never blocks its loop. The OpenAI routes against
# plain `vllm serve`: docs/BENCHMARKS.md (its effect not yet measured apart from the machine's noise).
SERVE_LOOP_ENV = {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0", "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0"}


def with_serve_loop_env(actor_options: dict) -> dict:
    """`ray_actor_options` whose process gets `SERVE_LOOP_ENV` (its own env_vars win)."""
    runtime_env = dict(actor_options.get("runtime_env") or {})
    runtime_env["env_vars"] = {**SERVE_LOOP_ENV, **runtime_env.get("env_vars", {})}
    return {**actor_options, "runtime_env": runtime_env}


def engine_deployment(config: AppConfig):
    r = config.replicas
    placement = config.placement().deployment_options()
    options = {
        "name": ENGINE_DEPLOYMENT,
        **placement,
        "ray_actor_options": with_serve_loop_env(placement["ray_actor_options"]),
        "max_ongoing_requests": r.max_ongoing_requests,
        "health_check_period_s": r.health_check_period_s,
        # Scale-down: Serve waits for the calls in flight (polling every wait_loop_s; a call for a
        # session of the stopping replica meanwhile replays it elsewhere, so the poll is short), then
        # the replica's __del__ moves its open sessions to others (`pipeline.replica.drain`).
        "graceful_shutdown_timeout_s": r.drain_timeout_s,
        "graceful_shutdown_wait_loop_s": min(2.0, r.report_interval_s),
        "request_router_config": RequestRouterConfig(
            request_router_class=AffinityRouter,
            request_routing_stats_period_s=r.report_interval_s,
            request_routing_stats_timeout_s=max(5.0, 5 * r.report_interval_s),
        ),
    }
    scaling = autoscaling_config(r)
    if scaling is None:
        options["num_replicas"] = r.min_replicas
    else:
        options["autoscaling_config"] = scaling
    return serve.deployment(EngineReplica).options(**options)


def ingress_deployment(config: AppConfig):
    """Stateless HTTP replicas on any node with room (`ingress.resources` may name CPU nodes), not
    pinned to the head: with Serve's proxies on every node (deploy/serve.yaml), no answer token
    needs to cross the head."""
    i = config.ingress
    scaling = ({"num_replicas": i.replicas} if i.max_replicas is None or i.max_replicas <= i.replicas else
               {"autoscaling_config": {"min_replicas": i.replicas, "max_replicas": i.max_replicas,
                                       "target_ongoing_requests": i.target_ongoing_requests}})
    return serve.deployment(serve.ingress(api)(IngressRoutes)).options(
        name=INGRESS_DEPLOYMENT, **scaling,
        ray_actor_options=with_serve_loop_env({"num_cpus": config.replicas.ingress_num_cpus,
                                               "resources": dict(i.resources)}),
        max_ongoing_requests=1024,
        health_check_period_s=config.replicas.health_check_period_s,
    )


def build_app(config: AppConfig | None = None):
    """The Serve application: HTTP ingress -> engine replicas (+ central scheduler actor)."""
    config = config or AppConfig()
    data = config.model_dump(mode="json")
    engine = engine_deployment(config).bind(data)
    return ingress_deployment(config).bind(engine, data)


def app_builder(args: dict):
    """Entry point of `serve run pipeline.app:app_builder` and Serve config files.

    `args` is an `AppConfig` dict; keys containing dots (`model.model=tiny`, as the `serve run`
    command line passes them) are applied as nested overrides; `config_file` loads a YAML first.
    """
    args = dict(args or {})
    path = args.pop("config_file", None)
    dotted = {k: _scalar(v) for k, v in args.items() if "." in k}
    nested = {k: v for k, v in args.items() if "." not in k}
    config = load_config(path, overrides=dotted) if path or dotted else AppConfig()
    if nested:
        config = AppConfig.model_validate({**config.model_dump(), **nested})
    return build_app(config)


def _scalar(value):
    """`serve run` passes command-line args as strings: turn numbers and booleans back."""
    if not isinstance(value, str):
        return value
    import yaml

    return yaml.safe_load(value)
