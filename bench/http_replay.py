"""Replay query traces against the Serve application over HTTP: the user's view of each policy.

    spec = BenchSpec(workload="crawler", requests=16, qps=(0.2,), policies=("fcfs",))
    result = run_bench(spec, trace_dir)   # {"config", "cells": [...], "requests": [...]}

One app run per policy (`pipeline.run.local.local_app`); inside it, one cell per (QPS, prompt mode):
each request's trace is written as its own CSV in the app's trace folder (the `trace` source replays
the first query of a named file), requests are sent at seeded Poisson arrival times as concurrent
tasks through `pipeline.run.rag_client.ask`, and `GET /v1/cluster` is sampled as a time series.
Both modes of a QPS share arrival times and trace shapes; their texts differ (file names and
doc ids carry the cell), so the prefix cache never serves one cell's KV to another. Recorded or
paper-format CSVs keep their own text: a stream cell may reuse prefix-cached KV of an earlier cell
that replayed the same query (one-shot requests are salted and never do); run one cell for clean
figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import httpx

from bench import ingress_costs
from bench.serving_metrics import MetricsError, record_from_summary, serving_metrics
from bench.stats import percentile

from stream2llm.data.traces import (PromptMode, QueryTrace, poisson_arrivals, read_crawler_csv, read_vector_csv,
                               synthetic_crawler_traces, synthetic_vector_traces, write_crawler_csv,
                               write_vector_csv)

MODES = tuple(PromptMode)
SYNTHETIC = {"crawler": synthetic_crawler_traces, "vector": synthetic_vector_traces}
POLL_INTERVAL_S = 0.5
# A short crawler-shaped request sent before the cells: the replica's first prefill is not timed.
# Synthetic shapes scaled to what one CPU replica prefills while chunks arrive (DESIGN.md 5-6):
# crawler ~6.5 chunks of ~300-500 tokens, ~0.7 s apart (~2.5k tokens); vector: top-4 contexts of
# ~1.2k tokens.
CPU_SHAPES = {"crawler": dict(mean_scrapes=5.5, search_s=1.0, search_tokens=300, page_tokens=400,
                              gap_median_s=0.7, gap_mean_s=0.9),
              "vector": dict(top_k=4)}
WARM_UP_SHAPE = dict(mean_scrapes=1, search_s=0.05, gap_median_s=0.05, gap_mean_s=0.05,
                     search_tokens=100, page_tokens=100)


class BenchError(ValueError):
    """A benchmark argument is invalid."""


@dataclass
class BenchSpec:
    workload: str = "crawler"  # "crawler" | "vector" | path of a crawler/vector CSV
    requests: int = 16
    qps: tuple[float, ...] = (0.2,)
    policies: tuple[str, ...] = ("fcfs",)
    modes: tuple[str, ...] = MODES
    multiplier: float = 1.0  # the paper's delay multiplier (retrievers.trace_multiplier)
    seed: int = 0
    max_tokens: int = 16
    clients: int = 0  # > 0: closed loop, this many clients each sending its next request when one ends
    slos_ms: dict = field(default_factory=dict)  # request_goodput's SLOs: {"ttft"|"tpot"|"e2el": ms}
    shape: dict = field(default_factory=dict)  # synthetic generator overrides
    app: dict = field(default_factory=dict)  # AppConfig sections (nested dict)

    def validate(self) -> None:
        if self.requests <= 0 or not self.qps or min(self.qps) <= 0 or self.multiplier <= 0:
            raise BenchError("requests, qps and multiplier must be > 0")
        if self.clients < 0:
            raise BenchError(f"clients must be >= 0 (0: open loop), got {self.clients}")
        try:
            serving_metrics([], 1.0, slos_ms=self.slos_ms)
        except MetricsError as e:
            raise BenchError(str(e)) from None
        unknown = set(self.modes) - set(MODES)
        if unknown or not self.modes:
            raise BenchError(f"unknown prompt modes {sorted(unknown)}; valid: {', '.join(MODES)}")
        from scheduler.policies import make_policy

        for name in self.policies:
            make_policy(name)  # UnknownPolicyError lists the valid names
        if self.workload not in SYNTHETIC and not Path(self.workload).is_file():
            raise BenchError(f"workload must be crawler, vector or a trace CSV path, got {self.workload!r}")
        load_traces(self)  # bad shape parameters or a malformed CSV fail here, before any app starts


# ---- traces -------------------------------------------------------------------------------------
def load_traces(spec: BenchSpec) -> list[QueryTrace]:
    """`spec.requests` traces: synthetic, or the queries of a CSV (cycled when there are fewer)."""
    if spec.workload in SYNTHETIC:
        return SYNTHETIC[spec.workload](spec.requests, spec.seed, **spec.shape)
    path = Path(spec.workload)
    with path.open(encoding="utf-8") as f:
        vector = "PipelinePool" in f.readline()
    traces = read_vector_csv(path) if vector else read_crawler_csv(path)
    return [traces[i % len(traces)] for i in range(spec.requests)]


def _tagged(trace: QueryTrace, tag: str) -> QueryTrace:
    """Synthetic vector doc ids made unique to a cell (their filler text is keyed by doc id)."""
    rename = {d: f"{tag}-{d}" for d in trace.doc_tokens}
    events = tuple(replace(e, doc_ids=tuple(rename.get(d, d) for d in e.doc_ids)) for e in trace.events)
    return replace(trace, events=events, doc_tokens={rename[d]: n for d, n in trace.doc_tokens.items()})


def write_request_traces(traces: list[QueryTrace], folder: Path, tag: str,
                         synthetic: bool = True) -> list[tuple[str, str]]:
    """One CSV per request, named `<tag>-<i>.csv`; returns (file name, question) pairs.
    Crawler filler text is keyed by the file name, so every file gets its own text."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for i, trace in enumerate(traces):
        name = f"{tag}-{i:04d}.csv"
        if trace.shape == "vector":
            write_vector_csv([_tagged(trace, tag) if synthetic else trace], folder / name)
        else:
            write_crawler_csv([trace], folder / name)
        out.append((name, trace.query))
    return out


# ---- statistics (pure) --------------------------------------------------------------------------
def ccdf(values) -> tuple[list[float], list[float]]:
    """Sorted values and P(X >= x) at each: from 1 down to 1/n (plottable on a log axis)."""
    xs = sorted(v for v in values if v is not None)
    n = len(xs)
    return xs, [(n - i) / n for i in range(n)]


def aggregate(requests: list[dict], slos_ms: dict | None = None) -> dict:
    """Counts, client TTFT percentiles, engine TTFT p50, pipeline overhead p50, makespan, end-to-end
    latency p50/p99 of the answered, and the `vllm bench serve` metrics over the makespan (`serving`)."""
    ok = [r for r in requests if r["ok"]]
    ttft = [r["ttft_s"] for r in ok]
    overhead = [r["ttft_s"] - r["engine_ttft_s"] for r in ok
                if r["ttft_s"] is not None and r["engine_ttft_s"] is not None]
    done = [r["sent_s"] + r["latency_s"] for r in requests if r["latency_s"] is not None]
    makespan = max(done) - min(r["sent_s"] for r in requests) if done else None
    e2e = [r["latency_s"] for r in ok]
    return {
        "sessions": len(requests), "answered": len(ok),
        "rejected": sum(1 for r in requests if not r["ok"] and r["status"] == 429),
        "failed": sum(1 for r in requests if not r["ok"] and r["status"] != 429),
        "ttft_p50_s": percentile(ttft, 50), "ttft_p95_s": percentile(ttft, 95),
        "ttft_p99_s": percentile(ttft, 99),
        "engine_ttft_p50_s": percentile([r["engine_ttft_s"] for r in ok], 50),
        "pipeline_overhead_p50_s": percentile(overhead, 50),
        "makespan_s": makespan,
        "e2e_p50_s": percentile(e2e, 50), "e2e_p99_s": percentile(e2e, 99),
        "sessions_per_s": len(ok) / makespan if makespan else None,
        "serving": serving_metrics([record_from_summary(r) for r in requests], makespan, slos_ms=slos_ms)
        if makespan else None,
    }


def cluster_sample(view: dict, t_s: float) -> dict:
    """One point of the time series from a `GET /v1/cluster` answer."""
    p, reports = view["pressure"], list(view["replicas"].values())
    return {"t_s": round(t_s, 3), "replicas": p["replicas"], "kv_blocks_used": p["kv_blocks_used"],
            "kv_blocks_total": p["kv_blocks_total"], "sessions": p["sessions"], "queued": p["queued"],
            "active": sum(r["sessions_active"] for r in reports),
            "idle": sum(r["sessions_idle"] for r in reports),
            "preemptions": sum(r["preemptions"] for r in reports)}


# ---- one cell over HTTP -------------------------------------------------------------------------
async def poll_cluster(http: httpx.AsyncClient, base: str, stop: asyncio.Event, t0: float,
                       interval_s: float = POLL_INTERVAL_S) -> list[dict]:
    samples = []
    while not stop.is_set():
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
            response = await http.get(f"{base}/v1/cluster", timeout=5)
            samples.append(cluster_sample(response.json(), time.monotonic() - t0))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)
    return samples


async def _one(http, base, name: str, question: str, send_at: float, mode: str, max_tokens: int) -> dict:
    from pipeline.run.rag_client import ask

    await asyncio.sleep(max(0.0, send_at - time.monotonic()))
    result = await ask(http, base, question, {"type": "trace", "trace": name},
                       prompt_mode=mode, max_tokens=max_tokens)
    return {**result.summary(), "trace": name, **relative_timings(result)}


def relative_timings(result) -> dict:
    """A RagResult's event times in seconds after it was sent (`bench.serving_metrics.record_from_summary`)."""
    def rel(t):
        return None if t is None else round(t - result.sent_at, 4)

    return {"first_token_s": rel(result.first_token_at), "retrieval_done_s": rel(result.retrieval_done_at),
            "token_times_s": [rel(t) for t in result.token_times], "output_tokens": result.final.get("output_tokens")}


async def run_cell(base: str, requests: list[tuple[str, str]], arrivals: list[float] | None, mode: str,
                   max_tokens: int, on_done: Callable[[], None] = lambda: None, clients: int = 0) -> dict:
    """Open loop: send every request at its arrival time. Closed loop (`clients` > 0, `arrivals`
    None): each client sends the next unsent request as soon as its previous one ended. Per-request
    summaries and the cluster time series."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=None, limits=limits) as http:
        t0 = time.monotonic()
        stop = asyncio.Event()
        poller = asyncio.create_task(poll_cluster(http, base, stop, t0))
        counters_before = await ingress_costs.scrape(http, base)

        async def tracked(name, question, at):
            summary = await _one(http, base, name, question, t0 + at, mode, max_tokens)
            on_done()
            return {**summary, "arrival_s": round(at, 4), "sent_s": summary["sent_at"] - t0}

        pending = iter(requests)

        async def client() -> list[dict]:
            return [await tracked(n, q, time.monotonic() - t0) for n, q in pending]

        try:
            if clients:
                summaries = [r for batch in await asyncio.gather(*(client() for _ in range(clients))) for r in batch]
            else:
                summaries = await asyncio.gather(*(tracked(n, q, at) for (n, q), at in zip(requests, arrivals)))
            ingress = ingress_costs.per_session(counters_before, await ingress_costs.scrape(http, base), summaries)
        finally:
            stop.set()
            series = await poller
    return {"requests": sorted(summaries, key=lambda r: r["trace"]), "series": series, "ingress": ingress}


# ---- whole benchmark ----------------------------------------------------------------------------
def app_config(spec: BenchSpec, policy: str, trace_dir: Path):
    from pipeline.config import AppConfig

    data = {name: dict(section) for name, section in spec.app.items()}
    data.setdefault("model", {})["policy"] = policy
    data.setdefault("retrievers", {}).update(trace_dir=str(trace_dir), trace_multiplier=spec.multiplier)
    return AppConfig.model_validate(data)


async def _warm_up(base: str, trace_dir: Path, seed: int) -> None:
    from pipeline.run.rag_client import ask

    trace = synthetic_crawler_traces(1, seed, **WARM_UP_SHAPE)
    ((name, question),) = write_request_traces(trace, trace_dir, f"warmup-{time.time_ns()}")
    async with httpx.AsyncClient(timeout=None) as http:
        result = await ask(http, base, question, {"type": "trace", "trace": name}, max_tokens=2)
    if not result.ok:
        raise RuntimeError(f"warm-up request failed: {result.status} {result.error}")


async def _policy_cells(base: str, spec: BenchSpec, policy: str, trace_dir: Path, on_done) -> list[dict]:
    await _warm_up(base, trace_dir, spec.seed)
    traces = load_traces(spec)
    cells = []
    # closed loop: one cell per mode, labelled qps 0 (the rate is whatever the clients achieve)
    for qps in spec.qps if not spec.clients else (0.0,):
        arrivals = None if spec.clients else poisson_arrivals(spec.requests, qps, spec.seed)
        for mode in spec.modes:
            tag = f"{policy}-{mode}-q{qps:g}" if not spec.clients else f"{policy}-{mode}-c{spec.clients}"
            requests = write_request_traces(traces, trace_dir, tag, spec.workload in SYNTHETIC)
            cell = await run_cell(base, requests, arrivals, mode, spec.max_tokens, on_done, spec.clients)
            labels = {"policy": policy, "mode": mode, "qps": qps, "clients": spec.clients}
            cell["requests"] = [{**labels, **r} for r in cell["requests"]]
            peak = max((s["sessions"] for s in cell["series"]), default=None)
            cells.append({**labels, **aggregate(cell["requests"], spec.slos_ms), "peak_sessions": peak, **cell})
    return cells


def run_policy(spec: BenchSpec, policy: str, trace_dir: Path, on_done=lambda: None) -> list[dict]:
    """Start the app with `policy`, run every (QPS, mode) cell against it, tear it down."""
    from pipeline.run.local import local_app

    config = app_config(spec, policy, trace_dir)
    ready = max(1, config.replicas.initial_replicas or config.replicas.min_replicas)
    with local_app(config, ready_replicas=ready) as base:
        return asyncio.run(_policy_cells(base, spec, policy, trace_dir, on_done))


def run_bench(spec: BenchSpec, trace_dir: Path, on_done: Callable[[], None] = lambda: None) -> dict:
    """Every policy; `{"config", "cells": [aggregates + series], "requests": [flat summaries]}`."""
    spec.validate()
    started = time.monotonic()
    cells = [c for policy in spec.policies for c in run_policy(spec, policy, trace_dir, on_done)]
    requests = [r for c in cells for r in c.pop("requests")]
    return {"config": {**asdict(spec), "qps": list(spec.qps)}, "wall_s": round(time.monotonic() - started, 1),
            "cells": cells, "requests": requests}
