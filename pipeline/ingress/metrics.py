"""Prometheus metrics served by the ingress at /metrics (its own registry, text format).

Per-replica gauges (KV use, sessions, preemptions) are refreshed from the central scheduler's
view (replica reports) when /metrics is scraped; counters and the TTFT histogram are recorded by
the ingress as sessions finish.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST

# Names the benchmarks read back from /metrics (`bench.ingress_costs`); counters gain `_total`.
INGRESS_CHUNK_BYTES = "stream2llm_ingress_chunk_bytes"
REPLICA_CONTEXT_CHUNKS = "stream2llm_replica_context_chunks"
INGRESS_PROCESS = "stream2llm_ingress"  # the process collector's namespace
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TPOT_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0)


class PipelineMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.ttft = Histogram("stream2llm_ttft_seconds", "Time to first token after the question",
                              ["endpoint"], buckets=TTFT_BUCKETS, registry=r)
        self.tpot = Histogram("stream2llm_tpot_seconds", "Time per output token after the first (OpenAI "
                              "routes, as vLLM timed the request)", ["endpoint"], buckets=TPOT_BUCKETS, registry=r)
        self.kv_used = Gauge("stream2llm_kv_blocks_used", "KV blocks in use", ["replica"], registry=r)
        self.kv_total = Gauge("stream2llm_kv_blocks_total", "KV blocks", ["replica"], registry=r)
        self.kv_usage = Gauge("stream2llm_kv_usage_ratio", "KV blocks used / total", ["replica"], registry=r)
        self.sessions = Gauge("stream2llm_sessions", "Open sessions", ["replica", "state"], registry=r)
        self.preemptions = Gauge("stream2llm_preemptions", "Preemptions so far (recompute on CPU)",
                                 ["replica", "kind"], registry=r)
        self.invalidated = Counter("stream2llm_tokens_invalidated", "Context tokens invalidated by "
                                   "replace", registry=r)
        self.rejected = Counter("stream2llm_admissions_rejected", "Sessions answered 429", registry=r)
        self.recovered = Counter("stream2llm_sessions_recovered", "Sessions replayed elsewhere", registry=r)
        self.aborted = Counter("stream2llm_sessions_aborted", "Sessions aborted", ["reason"], registry=r)
        self.ingress_chunk_bytes = Counter(
            INGRESS_CHUNK_BYTES, "Context chunk text bytes handled by this ingress replica "
            "(client chunks, inline documents, the one-shot baseline; retriever sources stream to the "
            "replicas and add nothing)", registry=r)
        self.replica_chunks = Counter(
            REPLICA_CONTEXT_CHUNKS, "Retrieved pieces the replicas pulled from retriever "
            "actors themselves (one Ray hop each; the ingress got a summary)", registry=r)
        self.queued = Gauge("stream2llm_admission_queue", "Sessions waiting for admission", registry=r)
        self.admissions = Gauge(
            "stream2llm_admissions", "Admissions by this ingress replica so far, by how they were decided "
            "(`slot`: an admission slot held here, no actor call; `actor`: a call to the central actor)",
            ["path"], registry=r)
        self.pressure = Gauge("stream2llm_cluster_kv_projected_ratio", "Projected cluster KV use", registry=r)
        self.moves = Gauge("stream2llm_session_moves", "Sessions that left a replica for another, cluster-wide "
                           "since the central scheduler started: moved by a stopping replica, move_failed, "
                           "replayed from scratch", ["outcome"], registry=r)
        # this ingress replica's own process: CPU seconds, memory, open files (benchmarks read its CPU)
        ProcessCollector(namespace=INGRESS_PROCESS, registry=r)

    def observe_final(self, endpoint: str, stats: dict) -> None:
        if stats.get("ttft_s") is not None:
            self.ttft.labels(endpoint).observe(stats["ttft_s"])
        self.invalidated.inc(stats.get("tokens_invalidated", 0) or 0)

    def observe_openai(self, endpoint: str, timings) -> None:
        """An OpenAI request's `engine.api.OpenAITimings` (TTFT from the engine's arrival)."""
        if timings.ttft_s is not None:
            self.ttft.labels(endpoint).observe(timings.ttft_s)
        if timings.tpot_s is not None:
            self.tpot.labels(endpoint).observe(timings.tpot_s)

    def count_admissions(self, from_slots: int, through_actor: int) -> None:
        self.admissions.labels("slot").set(from_slots)
        self.admissions.labels("actor").set(through_actor)

    def refresh(self, replicas: dict, pressure: dict, moves: dict | None = None) -> None:
        for name in ("kv_used", "kv_total", "kv_usage", "sessions", "preemptions"):
            getattr(self, name).clear()  # replicas that went away must disappear
        for rid, r in replicas.items():
            self.kv_used.labels(rid).set(r["kv_blocks_used"])
            self.kv_total.labels(rid).set(r["kv_blocks_total"])
            self.kv_usage.labels(rid).set(r["kv_blocks_used"] / max(r["kv_blocks_total"], 1))
            self.sessions.labels(rid, "active").set(r["sessions_active"])
            self.sessions.labels(rid, "idle").set(r["sessions_idle"])
            self.preemptions.labels(rid, "recompute").set(r.get("preemptions", 0))
        self.queued.set(pressure.get("queued", 0))
        self.pressure.set(pressure.get("projected_frac", 0.0))
        for outcome, n in (moves or {}).items():
            self.moves.labels(outcome).set(n)

    def render(self) -> bytes:
        return generate_latest(self.registry)
