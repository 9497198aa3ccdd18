"""Replay query traces through simulated engines: Poisson arrivals, streaming or not, metrics.

Streaming: each chunk is handed to the engine when it arrives (append extends the prompt; a
replace keeps the KV of the doc LCP); the question comes with the last chunk. Non-streaming: the
whole final prompt is submitted when the last chunk arrives. TTFT is measured from the arrival of
the last chunk (when the question is asked) to the end of the step that samples the first token.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from stream2llm.data.traces import ContextOp, PromptMode, QueryTrace, lcp_tokens
from scheduler.cost_model import CostModel
from scheduler.policies import make_policy
from scheduler.request import RequestView
from scheduler.simulator.arrivals import ARRIVALS, make_arrivals
from scheduler.simulator.engine import SimEngine, SimEngineConfig
from scheduler.simulator.routers import Router, SessionAsk, make_router

class SimConfigError(ValueError):
    """Bad simulation parameters."""


@dataclass(frozen=True)
class SimConfig:
    policy: str
    mode: PromptMode
    engine: SimEngineConfig
    num_engines: int = 1
    qps: float = 1.0
    seed: int = 0
    delay_multiplier: float = 1.0
    router: str = "least_active"  # scheduler.simulator.routers: how sessions pick an engine
    router_settings: dict = field(default_factory=dict, hash=False)
    arrivals: str = "poisson"     # scheduler.simulator.arrivals

    def __post_init__(self) -> None:
        if self.mode not in PromptMode.__members__.values():
            raise SimConfigError(f"unknown mode {self.mode!r}; valid: {', '.join(PromptMode)}")
        if self.num_engines < 1:
            raise SimConfigError(f"need at least one engine, got {self.num_engines}")
        make_policy(self.policy)  # raises UnknownPolicyError listing the valid names
        make_router(self.router, **self.router_settings)  # UnknownRouterError lists the valid names
        if self.arrivals not in ARRIVALS:
            raise SimConfigError(f"unknown arrivals {self.arrivals!r}; valid: {', '.join(sorted(ARRIVALS))}")


@dataclass
class SimResult:
    ttft_s: list[float]
    makespan_s: float
    preemptions: dict[str, int]
    tokens_invalidated: int
    tokens_recomputed: int
    tokens_computed: int
    steps: int
    mean_concurrent_streams: float
    max_concurrent_streams: int
    wall_s: float
    num_requests: int
    extra: dict = field(default_factory=dict)
    # Engine time spent stepping (prefill + recompute + decode), summed over engines: unlike the
    # makespan, which the arrivals can dominate, it differs by policy (recompute is extra work).
    busy_s: float = 0.0
    swaps_dropped: int = 0  # swapped KV discarded to make host room for a completed prompt

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.ttft_s, q)) if self.ttft_s else float("nan")

    def summary(self) -> dict:
        return {
            "ttft_p50_s": self.percentile(50), "ttft_p95_s": self.percentile(95),
            "ttft_p99_s": self.percentile(99), "makespan_s": self.makespan_s,
            "preemptions": sum(self.preemptions.values()),
            "preemptions_by_kind": dict(self.preemptions),
            "tokens_invalidated": self.tokens_invalidated,
            "tokens_recomputed": self.tokens_recomputed, "tokens_computed": self.tokens_computed,
            "steps": self.steps, "busy_s": self.busy_s, "swaps_dropped": self.swaps_dropped,
            "mean_concurrent_streams": self.mean_concurrent_streams,
            "max_concurrent_streams": self.max_concurrent_streams,
            "num_requests": self.num_requests, "wall_s": self.wall_s,
        }


_CHUNK, _STEP, _REPORT, _FINISH = 0, 1, 2, 3


def simulate(traces: Sequence[QueryTrace], config: SimConfig, cost: CostModel) -> SimResult:
    started = time.perf_counter()
    traces = [t.stretched(config.delay_multiplier) if config.delay_multiplier != 1 else t
              for t in traces]
    arrivals = make_arrivals(config.arrivals, len(traces), config.qps, config.seed)
    engines = [SimEngine(make_policy(config.policy), cost, config.engine)
               for _ in range(config.num_engines)]
    router = make_router(config.router, **config.router_settings)
    run = _Run(traces, arrivals, engines, config.mode == PromptMode.STREAM, router)
    run.loop()
    return run.result(config, started)


class _Run:
    def __init__(self, traces, arrivals, engines: list[SimEngine], streaming: bool,
                 router: Router | None = None):
        self.traces, self.arrivals, self.engines, self.streaming = traces, arrivals, engines, streaming
        self.router = router = router if router is not None else make_router("least_active")
        self.index = {t.query_id: q for q, t in enumerate(traces)}
        self.waiting: dict[int, list[tuple[int, float]]] = {}  # session -> chunks held while it queues
        self.open = len(traces)  # sessions not finished
        self.queue_waits: list[float] = []  # of sessions the router queued, from first chunk to placement
        self.events: list[tuple] = []
        for q, (trace, start) in enumerate(zip(traces, arrivals)):
            events = enumerate(trace.events) if streaming else [(len(trace.events) - 1, trace.events[-1])]
            for i, event in events:
                self.events.append((start + event.end_s, q, _CHUNK, i))
        router.bind(engines, 0.0)
        if router.report_interval_s is not None:  # each replica reports at its own phase
            for e in range(len(engines)):
                phase = router.report_interval_s * (e + 1) / len(engines)
                self.events.append((phase, -2, _REPORT, e))
        heapq.heapify(self.events)
        self.route: dict[int, int] = {}
        self.busy = [False] * len(engines)
        self.asked_at: dict[str, float] = {}
        self.ttft: list[float] = []
        self.last_finish = 0.0
        self.stream_spans = [(s + t.events[0].end_s, s + t.events[-1].end_s)
                             for t, s in zip(traces, arrivals)]

    def loop(self) -> None:
        events = self.events
        while events:
            now, q, kind, payload = heapq.heappop(events)
            if kind == _CHUNK:
                self._arrive(q, payload, now)
            elif kind == _REPORT:
                self.router.on_report(payload, now)
                self._admit_queued(now)
                if self.open:
                    self._stuck_check()
                    heapq.heappush(events, (now + self.router.report_interval_s, -2, _REPORT, payload))
            elif kind == _FINISH:
                self._finished(*payload, now)
            else:
                self._step(payload, now)

    def _arrive(self, q: int, index: int, now: float) -> None:
        if q not in self.route:
            if q not in self.waiting:
                trace = self.traces[q]
                placed = self.router.place(SessionAsk(trace.query_id, trace.shape), now)
                if placed is None:
                    self.waiting[q] = []
                else:
                    self.route[q] = placed
            if q in self.waiting:
                self.waiting[q].append((index, now))
                return
        self._deliver(q, index, now, now)
        self._wake(self.route[q], now)

    def _admit_queued(self, now: float) -> None:
        """Sessions the router placed from its queue: their held chunks go in now."""
        for session_id, e in self.router.admitted(now):
            q = self.index[session_id]
            self.route[q] = e
            self.queue_waits.append(now - self.waiting[q][0][1])
            for index, arrived in self.waiting.pop(q):
                self._deliver(q, index, now, arrived)
            self._wake(e, now)

    def _wake(self, e: int, now: float) -> None:
        if not self.busy[e]:
            self._step(e, now)

    def _deliver(self, q: int, index: int, now: float, arrived: float) -> int:
        trace = self.traces[q]
        request_id = trace.query_id
        event = trace.events[index]
        last = index == len(trace.events) - 1
        engine = self.engines[self.route[q]]
        if last:
            self.asked_at[request_id] = arrived
        if request_id not in engine.views:
            tokens = trace.total_context_tokens() if not self.streaming else (
                event.num_tokens + (trace.question_tokens if last and event.kind == ContextOp.APPEND else 0))
            engine.add_request(RequestView(request_id, q, now, now, tokens, complete=last,
                                           max_output_tokens=trace.output_tokens))
        elif event.kind == ContextOp.APPEND:
            engine.append(request_id, now, event.num_tokens + (trace.question_tokens if last else 0), last)
        else:
            previous = trace.events[index - 1].doc_ids
            keep = lcp_tokens(previous, event.doc_ids, trace.doc_tokens)
            engine.replace(request_id, now, event.num_tokens, keep, last)
        return self.route[q]

    def _step(self, e: int, now: float) -> None:
        outcome = self.engines[e].step(now)
        if outcome is None:
            self.busy[e] = False
            return
        self.busy[e] = True
        end = now + outcome.duration_s
        for request_id in outcome.first_tokens:
            self.ttft.append(end - self.asked_at[request_id])
        if outcome.finished:
            self.last_finish = max(self.last_finish, end)
            for request_id in outcome.finished:  # the router hears when the answer ends
                heapq.heappush(self.events, (end, -3, _FINISH, (request_id, e)))
        heapq.heappush(self.events, (end, -1, _STEP, e))

    def _stuck_check(self) -> None:
        """Queued sessions with nothing else left to happen would wait (and report) forever."""
        if self.waiting and not any(self.busy) and all(kind == _REPORT for _, _, kind, _ in self.events):
            raise RuntimeError(f"{len(self.waiting)} sessions queued and none can ever be placed")

    def _finished(self, request_id: str, e: int, now: float) -> None:
        self.open -= 1
        q = self.index[request_id]
        self.router.on_finish(request_id, e, self.traces[q].total_context_tokens(), now)
        self._admit_queued(now)

    def result(self, config: SimConfig, started: float) -> SimResult:
        preemptions = {"recompute": 0, "swap": 0}
        totals = {"tokens_invalidated": 0, "tokens_recomputed": 0, "tokens_computed": 0, "steps": 0, "busy_s": 0.0,
                  "swaps_dropped": 0}
        for engine in self.engines:
            for kind, count in engine.stats.preemptions.items():
                preemptions[kind] += count
            for key in totals:
                totals[key] += getattr(engine.stats, key)
        unfinished = sum(engine.num_active for engine in self.engines) + len(self.waiting)
        if unfinished:
            raise RuntimeError(f"simulation ended with {unfinished} unfinished requests")
        mean_streams, max_streams = _concurrency(self.stream_spans)
        return SimResult(self.ttft, self.last_finish, preemptions, totals["tokens_invalidated"],
                         totals["tokens_recomputed"], totals["tokens_computed"], totals["steps"],
                         mean_streams, max_streams, time.perf_counter() - started, len(self.traces),
                         busy_s=totals["busy_s"], swaps_dropped=totals["swaps_dropped"],
                         extra={"queue_waits_s": self.queue_waits, "router": self._router_stats()})

    def _router_stats(self) -> dict:
        stats = getattr(self.router, "stats", None)
        return stats() if stats is not None else {}


def _concurrency(spans: list[tuple[float, float]]) -> tuple[float, int]:
    """Mean (over the busy period) and max number of streams between first and last chunk."""
    points = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    open_, peak, area = 0, 0, 0.0
    for (t, delta), (t_next, _) in zip(points, points[1:] + [points[-1]]):
        open_ += delta
        peak = max(peak, open_)
        area += open_ * (t_next - t)
    span = points[-1][0] - points[0][0] if points else 0.0
    return (area / span if span else 0.0), peak

