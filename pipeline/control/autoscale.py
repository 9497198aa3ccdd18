"""Custom Serve autoscaling policy for the engine replicas: KV pressure plus queued sessions.

Ray 2.60 accepts a policy function (`AutoscalingPolicy(policy_function=...)`) that receives an
`AutoscalingContext` with the custom metrics replicas return from `record_autoscaling_stats`.
Replicas report their own real KV use and the central scheduler's view: the cluster's load (the
higher of real KV use and running sequences against `max_num_seqs`:
`scheduler.replica_index.ClusterPressure.load_frac`, real signals that admission reads too) and
the sessions waiting for admission. The projected growth is not read as load: it decides
placement and admission, and when it fills the admission budget sessions queue, which counts. Serve 2.60 wraps every deployment-level policy, this one included,
with `ray.serve.autoscaling_policy._apply_autoscaling_config` (`DeploymentAutoscalingState.register`):
scaling factors, min/max and the upscale/downscale delays apply to its decision
(tests/test_autoscale_policy.py drives it through that wrapper).

Scale to zero is refused (`ReplicaSettings` rejects `min_replicas=0`): sessions are admitted by the
central scheduler before any call reaches a replica, so Serve's cold-start path (requests queued at
handles) never sees them. On scale-down Serve stops a replica of its choosing: it takes it out of
routing and lets its in-flight calls (answer streams) finish within `graceful_shutdown_timeout_s`
(`replicas.drain_timeout_s`); the replica's shutdown marks it draining at the central scheduler
(`pipeline.control.central_client.drain_replica`) and moves the streaming sessions still open on it
to other replicas before it stops (`pipeline.replica.drain`), so their next call finds them ready.
"""

from __future__ import annotations

from scheduler.admission import desired_replicas


def _mean(per_replica: dict) -> float:
    values = [float(v) for v in per_replica.values()]
    return sum(values) / len(values) if values else 0.0


def _max(per_replica: dict) -> float:
    return max((float(v) for v in per_replica.values()), default=0.0)


class KVPressurePolicy:
    """Desired replicas from real KV use, sequence slots and the admission queue (see module doc)."""

    def __init__(self, target_kv_frac: float = 0.7, sessions_per_replica: float = 8.0):
        self.target_kv_frac = target_kv_frac
        self.sessions_per_replica = sessions_per_replica

    def __call__(self, ctx):
        metrics = ctx.aggregated_metrics or {}
        own = _mean(metrics.get("kv_used_frac", {}))
        cluster = _max(metrics.get("cluster_load_frac", {}))
        queued = int(_max(metrics.get("cluster_queued", {})))
        want = desired_replicas(
            current=ctx.current_num_replicas, pressure_frac=max(own, cluster), queued=queued,
            target_frac=self.target_kv_frac, sessions_per_replica=self.sessions_per_replica,
            min_replicas=ctx.capacity_adjusted_min_replicas,
            max_replicas=ctx.capacity_adjusted_max_replicas,
        )
        return want, {"kv_frac": max(own, cluster), "queued": queued}


def autoscaling_config(replicas) -> dict | None:
    """Serve `autoscaling_config` for the engine deployment (None: a fixed replica count)."""
    if replicas.min_replicas == replicas.max_replicas:
        return None
    return {
        "min_replicas": replicas.min_replicas,
        "max_replicas": replicas.max_replicas,
        "initial_replicas": replicas.initial_replicas,
        "upscale_delay_s": replicas.upscale_delay_s,
        "downscale_delay_s": replicas.downscale_delay_s,
        "metrics_interval_s": replicas.report_interval_s,
        "look_back_period_s": max(2.0, 2 * replicas.report_interval_s),
        "policy": {
            "policy_function": "pipeline.control.autoscale:KVPressurePolicy",
            "policy_kwargs": {"target_kv_frac": replicas.target_kv_frac,
                              "sessions_per_replica": replicas.sessions_per_replica},
        },
    }
