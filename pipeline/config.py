"""One pydantic config for the whole application, with embedded defaults for a laptop.

Defaults: local Ray, CPU replicas (1 CPU each), SmolLM2, the offline corpus and its local site.
`AppConfig.engine_config()` converts the model section to the engine's plain `EngineConfig`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from engine.config import EngineConfig


CPU_ENGINE_ENV = {"OMP_NUM_THREADS": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                  "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


_ENGINE = EngineConfig()  # defaults follow the engine's own


class ModelSettings(_Section):
    model: str = Field(_ENGINE.model, description='Model folder or offline name: "smollm2" or "tiny".')
    served_name: str = Field("stream2llm", description="Model name shown by /v1/models.")
    max_model_len: int = Field(_ENGINE.max_model_len, gt=0, description="Context length of the model (tokens).")
    kv_cache_memory_bytes: int | None = Field(_ENGINE.kv_cache_memory_bytes, description="KV cache size per replica.")
    block_size: int = Field(_ENGINE.block_size, gt=0, description="KV block size (tokens).")
    max_num_seqs: int = Field(_ENGINE.max_num_seqs, gt=0, description="Sequences a replica runs at once.")
    max_num_batched_tokens: int = Field(_ENGINE.max_num_batched_tokens, gt=0, description="Token budget of one step.")
    enable_prefix_caching: bool = Field(_ENGINE.enable_prefix_caching, description="Reuse KV of shared prefixes.")
    policy: str = Field(_ENGINE.policy, description="Scheduling policy (fcfs, lcas, mcps, ...).")
    dtype: str = Field(_ENGINE.dtype, description="Model dtype.")
    seed: int = Field(_ENGINE.seed, description="Engine seed.")
    answer_budget_tokens: int = Field(_ENGINE.answer_budget_tokens, gt=0, description="Tokens kept free for the answer.")
    extra_engine_args: dict = Field(default_factory=dict, description="Passed to vLLM as is.")


class ReplicaSettings(_Section):
    min_replicas: int = Field(1, ge=0, description="Autoscaling lower bound.")
    max_replicas: int = Field(1, ge=1, description="Autoscaling upper bound.")
    initial_replicas: int | None = Field(None, description="Replicas at start (default min).")
    use_gpu: bool = Field(False, description="Ask one GPU per replica (GPU cluster).")
    num_cpus: float = Field(1.0, ge=0, description="CPUs per replica (1 on a 2-core machine).")
    resources: dict[str, float] = Field(default_factory=dict, description="Custom Ray resources.")
    max_ongoing_requests: int = Field(256, gt=0, description="Concurrent calls per replica.")
    report_interval_s: float = Field(1.0, gt=0, description="Replica -> scheduler report period.")
    target_kv_frac: float = Field(0.7, gt=0, le=1, description="Projected KV use to scale at.")
    sessions_per_replica: float = Field(8.0, gt=0, description="Queued sessions one replica absorbs.")
    upscale_delay_s: float = Field(2.0, ge=0, description="Sustained pressure before scaling up.")
    downscale_delay_s: float = Field(10.0, ge=0, description="Sustained calm before scaling down.")
    ingress_num_cpus: float = Field(0.0, ge=0, description="CPUs of the HTTP ingress replica.")
    scheduler_num_cpus: float = Field(0.0, ge=0, description="CPUs of the central scheduler actor.")

    @model_validator(mode="after")
    def _bounds(self):
        if self.min_replicas > self.max_replicas:
            raise ValueError("min_replicas must be <= max_replicas")
        start = self.initial_replicas
        if start is not None and not self.min_replicas <= start <= self.max_replicas:
            raise ValueError("initial_replicas must be within [min_replicas, max_replicas]")
        return self

    def actor_options(self) -> dict:
        options: dict = {"num_cpus": self.num_cpus, "num_gpus": 1 if self.use_gpu else 0}
        if self.resources:
            options["resources"] = dict(self.resources)
        if not self.use_gpu:  # in-process vLLM, one OpenMP thread (DESIGN.md section 5)
            options["runtime_env"] = {"env_vars": dict(CPU_ENGINE_ENV)}
        return options


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
    num_cpus: float = Field(0.0, ge=0, description="CPUs of each retriever actor.")


class LimitSettings(_Section):
    max_request_bytes: int = Field(1 << 20, gt=0, description="Largest accepted request body.")
    max_chunk_chars: int = Field(200_000, gt=0, description="Largest context chunk.")
    max_chunks_per_session: int = Field(64, gt=0, description="Appends/updates per session.")
    max_context_tokens: int = Field(7000, gt=0, description="Context tokens per session.")
    max_answer_tokens: int = Field(512, gt=0, description="Largest max_tokens a client may ask.")
    session_ttl_s: float = Field(120.0, gt=0, description="Idle session lifetime before abort.")
    max_queue: int = Field(16, ge=0, description="Sessions waiting for admission at most.")
    admission_timeout_s: float = Field(5.0, ge=0, description="Wait in the queue before 429.")


class SchedulerSettings(_Section):
    demand_priors: dict[str, int] = Field(
        default_factory=lambda: {"client": 2048, "crawler": 4096, "vector": 2048, "trace": 4096},
        description="Expected context tokens per source type before any session has finished.",
    )
    stale_after_s: float = Field(5.0, gt=0, description="A replica silent this long is not routed to.")
    reserve_frac: float = Field(0.05, ge=0, lt=1, description="KV kept free on every replica.")
    actor_name: str = Field("stream2llm_scheduler", description="Name of the central actor.")


class AuthSettings(_Section):
    bearer_tokens: list[str] = Field(default_factory=list, description="Accepted tokens; empty = no auth.")


class AppConfig(_Section):
    name: str = Field("stream2llm", description="Serve application name.")
    route_prefix: str = Field("/", description="HTTP route prefix.")
    model: ModelSettings = Field(default_factory=ModelSettings)
    replicas: ReplicaSettings = Field(default_factory=ReplicaSettings)
    retrievers: RetrieverSettings = Field(default_factory=RetrieverSettings)
    limits: LimitSettings = Field(default_factory=LimitSettings)
    scheduler: SchedulerSettings = Field(default_factory=SchedulerSettings)
    auth: AuthSettings = Field(default_factory=AuthSettings)

    def engine_config(self) -> EngineConfig:
        m = self.model
        return EngineConfig(
            model=m.model, max_model_len=m.max_model_len,
            kv_cache_memory_bytes=m.kv_cache_memory_bytes, block_size=m.block_size,
            max_num_seqs=m.max_num_seqs, max_num_batched_tokens=m.max_num_batched_tokens,
            enable_prefix_caching=m.enable_prefix_caching, policy=m.policy, seed=m.seed,
            dtype=m.dtype, answer_budget_tokens=m.answer_budget_tokens,
            extra_engine_args=dict(m.extra_engine_args),
        )


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
