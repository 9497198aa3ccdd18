"""One pydantic config for the whole application, with embedded defaults for a laptop.

Defaults: local Ray, CPU replicas (1 CPU each), SmolLM2, the offline corpus and its local site.
The `model` section is the engine's own `EngineConfig` (validated here, declared once there).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from engine.config import EngineConfig
from pipeline.errors import LimitExceeded, NeverFits
from pipeline.placement import ReplicaPlacement, replica_placement


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ReplicaSettings(_Section):
    min_replicas: int = Field(1, ge=0, description="Autoscaling lower bound.")
    max_replicas: int = Field(1, ge=1, description="Autoscaling upper bound.")
    initial_replicas: int | None = Field(None, description="Replicas at start (default min).")
    use_gpu: bool = Field(False, description=(
        "Run replicas on GPUs: tensor_parallel_size x pipeline_parallel_size GPUs each."))
    placement_strategy: str = Field("STRICT_PACK", description=(
        "Ray placement strategy of a multi-GPU replica's bundles (STRICT_PACK keeps it on one node)."))
    num_cpus: float = Field(1.0, ge=0, description=(
        "CPUs per replica (1 on a 2-core machine). A CPU replica of 2 or more runs vLLM's \"mp\" executor "
        "with a pinned OpenMP thread per core of its node, as `vllm serve` does: give it the node's cores."))
    cpu_reserved_cores: int = Field(0, ge=0, description=(
        "A CPU replica of num_cpus >= 2: cores of its node kept off the model's pinned OpenMP threads "
        "(vLLM's VLLM_CPU_NUM_OF_RESERVED_CPU), left to Ray, the HTTP path and the actors beside the "
        "model. 0: the model pins every core (vLLM's own default on x86 keeps one for its scheduler "
        "process; set 1 for that)."))
    resources: dict[str, float] = Field(default_factory=dict, description="Custom Ray resources.")
    max_ongoing_requests: int = Field(256, gt=0, description="Concurrent calls per replica.")
    report_interval_s: float = Field(1.0, gt=0, description="Replica -> scheduler report period.")
    health_check_period_s: float = Field(1.0, gt=0, description=(
        "Serve's health check of each engine and ingress replica: its controller drops a dead replica "
        "within about this long and routers follow its list (a router whose own call failed drops it at "
        "once). One cheap call per replica."))
    target_kv_frac: float = Field(0.7, gt=0, le=1, description="Projected KV use to scale at.")
    sessions_per_replica: float = Field(8.0, gt=0, description="Queued sessions one replica absorbs.")
    upscale_delay_s: float = Field(2.0, ge=0, description="Sustained pressure before scaling up.")
    downscale_delay_s: float = Field(10.0, ge=0, description="Sustained calm before scaling down.")
    ingress_num_cpus: float = Field(0.0, ge=0, description="CPUs of the HTTP ingress replica.")
    scheduler_num_cpus: float = Field(0.0, ge=0, description="CPUs of the central scheduler actor.")
    drain_timeout_s: float = Field(120.0, gt=0, description=(
        "How long a replica chosen for scale-down may take to finish its in-flight calls (answer streams) "
        "and move its open streaming sessions to other replicas before it is stopped (Serve's "
        "graceful_shutdown_timeout_s; the moves get 60% of it, pipeline.replica.drain); a session not moved "
        "by then is replayed on its next call."))

    @model_validator(mode="after")
    def _bounds(self):
        if self.min_replicas == 0:
            raise ValueError("min_replicas=0 is not supported: sessions are admitted by the central scheduler "
                             "before any request reaches a replica, so Serve never sees the load that would "
                             "wake a deployment scaled to zero; use min_replicas >= 1")
        if self.min_replicas > self.max_replicas:
            raise ValueError("min_replicas must be <= max_replicas")
        start = self.initial_replicas
        if start is not None and not self.min_replicas <= start <= self.max_replicas:
            raise ValueError("initial_replicas must be within [min_replicas, max_replicas]")
        return self


class RetrieverSettings(_Section):
    crawler_site: str = Field("local", description='"local" serves the offline corpus site; else a base URL.')
    crawler_max_pages: int = Field(8, gt=0, description="Pages a crawl fetches at most.")
    crawler_allowlist: list[str] = Field(default_factory=list, description=(
        "host:port pairs the crawler may fetch despite internal addresses (the local site is added)."))
    vector_top_k: int = Field(4, gt=0, description="Documents in each vector-search context.")
    site_latency_scale: float = Field(1.0, ge=0, description="Local site page latency multiplier.")
    vector_index: str | None = Field(None, description="FAISS index folder (default: cache).")
    trace_dir: str | None = Field(None, description="Folder of recorded traces (default: cache).")
    trace_multiplier: float = Field(1.0, gt=0, description="Trace replay delay multiplier.")
    replace_settle_s: float = Field(0.1, ge=0, description=(
        "A source's context replacement is prefilled once no newer one came for this long (or at "
        "once when another event comes, such as the end of retrieval): a progressive search refines "
        "its result tens of ms apart, and each refinement prefilled is work the next makes useless. "
        "0: prefill every replacement as it comes."))
    warm_pools: bool = Field(True, description=(
        "Start the crawler and vector actor pools (and the local site) when an ingress replica starts, "
        "so the first request of each source does not wait for its actor to start and load its model "
        "and index. Off: each pool starts at its first request."))
    pool_size: int = Field(1, ge=1, description=(
        "Retriever actors per kind (crawler, replay, vector per top-k), shared by every ingress replica; "
        "each call the ingress hands out goes to the next of them in turn."))
    num_cpus: float = Field(0.0, ge=0, description=(
        "CPUs of each retriever actor (0 here: 2 cores go to the engine replicas; give them real CPUs "
        "on a cluster, deploy/serve.yaml)."))
    resources: dict[str, float] = Field(default_factory=dict, description=(
        "Custom Ray resources of each retriever actor: a resource of the engine nodes places them beside "
        "the replicas that pull their streams."))
    vector_num_gpus: float = Field(0.0, ge=0, le=1, description=(
        "GPU share of the vector actor: > 0 runs FAISS (faiss-gpu) and the query embedder on the GPU "
        "Ray assigns it. A share of a replica's GPU needs that replica's gpu_memory_utilization lowered."))

    def vector_actor_options(self) -> dict:
        """Ray options of the vector actor: its GPU share is accounted for by Ray, not taken blindly."""
        return {**self.actor_options(), "num_gpus": self.vector_num_gpus}

    def actor_options(self) -> dict:
        """Ray options of every retriever actor."""
        return {"num_cpus": self.num_cpus, "resources": dict(self.resources)}

    @property
    def vector_on_gpu(self) -> bool:
        return self.vector_num_gpus > 0


class LimitSettings(_Section):
    max_request_bytes: int = Field(1 << 20, gt=0, description="Largest accepted request body.")
    max_chunk_chars: int = Field(200_000, gt=0, description="Largest context chunk.")
    max_chunks_per_session: int = Field(64, gt=0, description="Appends/updates per session.")
    max_context_tokens: int | None = Field(None, gt=0, description=(
        "Context tokens per session, if lower than the engine's own ceiling (model.context_limit: "
        "max_model_len - answer_budget_tokens), which is the default. A client's max_tokens is bounded "
        "by model.answer_budget_tokens, checked at the door."))
    session_ttl_s: float = Field(120.0, gt=0, description="Idle session lifetime before abort.")
    max_queue: int = Field(16, ge=0, description=(
        "Sessions waiting for admission. A full queue still takes one estimated to start within its "
        "admission_timeout_s (from the rate queued sessions were placed lately), up to 8 times this; "
        "else 429 at once, with Retry-After from that estimate."))
    admission_timeout_s: float = Field(5.0, ge=0, description=(
        "Deadline of an admission: how long a request waits in the queue for a replica with room (429 "
        "after it), or for a replica to start (503 after it)."))
    resume_grace_s: float = Field(5.0, ge=0, description=(
        "An answer nobody reads (the client left, or its ingress died) keeps generating this long for a "
        "reconnect with Last-Event-ID, then it is cancelled and its KV freed."))


class SchedulerSettings(_Section):
    demand_priors: dict[str, int] = Field(
        default_factory=lambda: {"client": 2048, "crawler": 4096, "vector": 2048, "trace": 4096},
        description=("Projected context tokens of a session of each source type until 3 sessions of that "
                     "type have finished; then a high percentile of the sizes they reached (growth_percentile)."),
    )
    growth_percentile: float = Field(0.9, gt=0, le=1, description=(
        "Percentile of the context sizes finished sessions of a source type reached (the last 256) that "
        "projects how far an open session of that type will grow."))
    overcommit: float = Field(2.0, ge=1, description=(
        "Projected KV (blocks used plus projected growth) admission allows, as a multiple of a replica's "
        "KV capacity: the engine parks idle streams and evicts them under pressure (recomputed when they "
        "resume), so sessions that are not all growing at once need not all fit. The blocks really used, "
        "and the context already accepted, must fit the capacity whatever this says. 1: no overcommit."))
    stale_after_s: float = Field(5.0, gt=0, description="A replica silent this long is not routed to.")
    reserve_frac: float = Field(0.05, ge=0, lt=1, description="KV kept free on every replica.")
    actor_name: str = Field("stream2llm_scheduler", description="Name of the central actor.")
    grace_s: float = Field(10.0, gt=0, description=(
        "A placed session its replica's reports do not list (never opened, or closed without a release) "
        "is dropped this long after its admission or the last report that listed it."))
    max_sessions: int = Field(200_000, gt=0, description="Placements the central actor holds at most.")
    request_lease_s: float = Field(600.0, gt=0, description=(
        "A one-shot request's admission expires after this unless released first."))
    admission_slots: int = Field(1024, ge=0, description=(
        "Admissions decided ahead that each ingress process may hold per source type (it holds about as "
        "many as it admitted in the last half slot lease), handed out without a call to the central "
        "actor; granted only while nobody is queued, at most half of a replica's free room. 0 = every "
        "admission calls the actor."))
    admission_slot_s: float = Field(2.0, gt=0, description=(
        "An admission slot nobody took expires after this; its reserved headroom returns."))


class IngressSettings(_Section):
    replicas: int = Field(1, ge=1, description=(
        "HTTP ingress replicas. Any replica serves any session (session records live in shard actors, "
        "answers on the engine replicas), so more replicas add throughput and survive an ingress death."))
    resources: dict[str, float] = Field(default_factory=dict, description=(
        "Custom Ray resources of each ingress replica: a CPU node type's resource keeps them on CPU nodes "
        "(none: Ray places them on any node with room; they are not pinned to the head)."))
    max_replicas: int | None = Field(None, ge=1, description=(
        "Autoscale the ingress between `replicas` and this by Serve's ongoing-request count (None: "
        "a fixed `replicas`)."))
    target_ongoing_requests: float = Field(64.0, gt=0, description=(
        "Open HTTP requests (SSE streams included) per ingress replica that Serve's autoscaler aims at."))
    session_shards: int = Field(4, ge=1, description=(
        "Actors holding streaming-input session records; a session's shard is a hash of its id, so "
        "changing this on a redeploy makes the sessions open at the time unknown (404)."))


class AuthSettings(_Section):
    bearer_tokens: list[str] = Field(default_factory=list, description="Accepted tokens; empty = no auth.")


class AppConfig(_Section):
    name: str = Field("stream2llm", description="Serve application name.")
    route_prefix: str = Field("/", description="HTTP route prefix.")
    model: EngineConfig = Field(default_factory=EngineConfig, description=(
        "The engine of every replica, handed to it unchanged (see engine.config.EngineConfig)."))
    replicas: ReplicaSettings = Field(default_factory=ReplicaSettings)
    retrievers: RetrieverSettings = Field(default_factory=RetrieverSettings)
    limits: LimitSettings = Field(default_factory=LimitSettings)
    scheduler: SchedulerSettings = Field(default_factory=SchedulerSettings)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    ingress: IngressSettings = Field(default_factory=IngressSettings)

    @model_validator(mode="after")
    def _placeable(self):
        self.placement()  # contradictions between engine and replica settings fail at load time
        cap = self.limits.max_context_tokens
        if cap is not None and cap > self.model.context_limit:
            raise ValueError(f"limits.max_context_tokens {cap} exceeds what the engine accepts "
                             f"(model.context_limit {self.model.context_limit})")
        return self

    @property
    def context_limit(self) -> int:
        """Context tokens one session may hold: the engine's ceiling or the stricter configured cap."""
        return self.limits.max_context_tokens or self.model.context_limit

    def check_answer_length(self, max_tokens: int) -> None:
        """The door's check of a request's max_tokens against the engine's answer budget, so that a
        too long answer is refused before retrieval rather than at the question."""
        budget = self.model.answer_budget_tokens
        if max_tokens >= self.model.max_model_len:  # no context at all would leave it room
            raise NeverFits(f"max_tokens {max_tokens} leaves no room for any context in the model's length of "
                            f"{self.model.max_model_len} tokens")
        if max_tokens > budget:
            raise LimitExceeded(f"max_tokens {max_tokens} exceeds the answer budget of {budget} tokens "
                                "(model.answer_budget_tokens)")

    def placement(self) -> ReplicaPlacement:
        """Actor options, placement bundles and the engine config of one engine replica."""
        r = self.replicas
        return replica_placement(self.model, use_gpu=r.use_gpu, num_cpus=r.num_cpus,
                                 resources=r.resources, strategy=r.placement_strategy,
                                 cpu_reserved_cores=r.cpu_reserved_cores)

    def engine_config(self) -> EngineConfig:
        """The engine config a replica builds (the executor set for its placement)."""
        return self.placement().engine


def load_config(path: str | None = None, overrides: dict | None = None) -> AppConfig:
    """Read a YAML/JSON file (or nothing: the defaults) and apply nested overrides."""
    data: dict = {}
    if path:
        import yaml  # ships with ray[serve]

        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return AppConfig.model_validate(data)
