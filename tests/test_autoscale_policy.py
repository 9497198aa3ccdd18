"""The engine deployment's autoscaling policy under Ray Serve 2.60's own wrapper.

Serve wraps every deployment-level policy, custom ones included, with
`ray.serve.autoscaling_policy._apply_autoscaling_config` (see `DeploymentAutoscalingState.register`
in ray/serve/_private/autoscaling_state.py): min/max, scaling factors and the upscale/downscale
delays apply to `KVPressurePolicy` as `pipeline.control.autoscale.autoscaling_config` wires it. These tests
build the policy exactly that way from our config and drive it with Serve's `AutoscalingContext`.
Delays are checked by conditions (a decision that must not change yet, then one that must change
before a generous deadline), never by measured durations.
"""

import time

import pytest
from ray.serve._private.autoscaling_state import _resolve_policy_callable
from ray.serve._private.common import DeploymentID
from ray.serve._private.constants import SERVE_AUTOSCALING_DECISION_TIMESTAMP_KEY
from ray.serve.autoscaling_policy import _apply_autoscaling_config
from ray.serve.config import AutoscalingConfig, AutoscalingContext

from pipeline.control.autoscale import autoscaling_config
from pipeline.config import ReplicaSettings


def serve_policy(**replicas):
    settings = ReplicaSettings(min_replicas=1, max_replicas=4, **replicas)
    config = AutoscalingConfig(**autoscaling_config(settings))
    return _apply_autoscaling_config(_resolve_policy_callable(config.policy)), config


def context(config, current: int, kv_frac: float, queued: int, state: dict) -> AutoscalingContext:
    replicas = {f"r{i}": kv_frac for i in range(current)}
    return AutoscalingContext(
        deployment_id=DeploymentID(name="EngineReplica", app_name="stream2llm"), deployment_name="EngineReplica",
        app_name="stream2llm", current_num_replicas=current, target_num_replicas=current, running_replicas=[],
        total_num_requests=0, total_queued_requests=0,
        aggregated_metrics={"kv_used_frac": replicas, "cluster_load_frac": replicas,
                            "cluster_queued": {r: queued for r in replicas}},
        raw_metrics={}, capacity_adjusted_min_replicas=config.min_replicas,
        capacity_adjusted_max_replicas=config.max_replicas, policy_state=state,
        last_scale_up_time=None, last_scale_down_time=None, current_time=time.time(), config=config)


def decide(policy, config, current, kv_frac, queued, state):
    want, state = policy(context(config, current, kv_frac, queued, state))
    return want, state


def test_without_delay_pressure_scales_up_at_once():
    policy, config = serve_policy(upscale_delay_s=0.0, target_kv_frac=0.5)
    assert decide(policy, config, 1, 0.9, 0, {})[0] == 2


@pytest.mark.parametrize("direction", ["up", "down"])
def test_delays_hold_the_decision_until_the_condition_lasted(direction):
    up = direction == "up"
    current, kv = (1, 0.95) if up else (3, 0.05)
    policy, config = serve_policy(upscale_delay_s=0.3, downscale_delay_s=0.3, target_kv_frac=0.5)
    want, state = decide(policy, config, current, kv, 0, {})
    assert want == current  # the first tick only starts the delay
    deadline = time.monotonic() + 60
    while want == current and time.monotonic() < deadline:
        time.sleep(0.05)
        want, state = decide(policy, config, current, kv, 0, state)
    assert (want > current) if up else (want < current)


def test_a_long_delay_is_not_crossed_and_a_calm_tick_resets_it():
    policy, config = serve_policy(upscale_delay_s=3600.0, target_kv_frac=0.5)
    state = {}
    for _ in range(20):
        want, state = decide(policy, config, 1, 0.95, 3, state)
        assert want == 1
    want, state = decide(policy, config, 1, 0.3, 0, state)  # calm: the pending scale-up is forgotten
    assert want == 1 and state.get(SERVE_AUTOSCALING_DECISION_TIMESTAMP_KEY) is None


def test_bounds_and_queue_drive_the_decision():
    policy, config = serve_policy(upscale_delay_s=0.0, target_kv_frac=0.5, sessions_per_replica=2)
    assert decide(policy, config, 2, 0.1, 9, {})[0] == 4  # queued sessions need replicas, capped at max


def test_min_replicas_zero_is_refused_with_a_reason():
    with pytest.raises(ValueError, match="min_replicas=0 is not supported"):
        ReplicaSettings(min_replicas=0, max_replicas=2)
