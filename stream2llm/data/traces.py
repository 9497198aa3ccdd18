"""Shared trace model: what a retrieval pipeline emitted for one query, and when.

Pure Python (stdlib + numpy). Used by trace replay (retrievers), the simulator (scheduler) and the
benchmarks. Two shapes, as in the paper (docs/ARCHITECTURE.md, "Workload shape"):

- crawler ("append"): each event is a chunk added to the end of the prompt;
- vector ("replace"): each event is a whole new ordered doc-id set; the KV of the longest common
  doc prefix (LCP) survives, the rest is invalidated. We read the paper's "~13k tokens per query"
  as tokens summed over a query's ~4.4 contexts (~2.9k each): a 13k-token final context would make
  streaming ~5x better at the median, not the paper's 1.4-1.8x.

CSV formats are the paper's, with optional extra columns that this module writes and reads:
- crawler: `type,query,content,startTime,endTime` (seconds from query start); many queries may share
  one file, grouped by `query`. Extra optional column `numTokens` (else tokens are estimated from
  `content` by `count_tokens`).
- vector: `StartTime_us,EndTime_us,PipelinePool` (microseconds; PipelinePool a JSON or Python list of
  doc ids). One query per file, or an optional `query` column to hold several queries in one file.
"""

from __future__ import annotations

import ast
import csv
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path

import numpy as np



class ContextOp(StrEnum):
    """How a piece changes a session's context, everywhere (traces, engine, pipeline, HTTP events):
    `append` extends it; `replace` swaps it whole, keeping the KV of the longest common prefix."""

    APPEND = "append"
    REPLACE = "replace"


class PromptMode(StrEnum):
    """How a session's prompt reaches the engine, everywhere (HTTP `prompt_mode`, simulator,
    benchmark results): `stream` prefills context as it arrives; `oneshot`, the baseline a plain
    vLLM server gives, sends the whole prompt once retrieval is done."""

    STREAM = "stream"
    ONESHOT = "oneshot"


class TraceFormatError(ValueError):
    """A trace file or trace argument is malformed."""


@dataclass(frozen=True)
class TraceEvent:
    start_s: float  # when retrieval of this piece began (seconds from query start)
    end_s: float  # when the piece became available (emit time)
    kind: ContextOp
    num_tokens: int  # append: tokens of the chunk; replace: tokens of the whole new context
    text: str = ""
    doc_ids: tuple[str, ...] = ()
    source: str = ""  # "tavily_search" | "page_scrape" | "vector"


@dataclass(frozen=True)
class QueryTrace:
    query_id: str
    shape: str  # "crawler" | "vector"
    query: str
    events: tuple[TraceEvent, ...]
    question_tokens: int
    output_tokens: int
    doc_tokens: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.events:
            raise TraceFormatError(f"trace {self.query_id!r} has no events")
        ends = [e.end_s for e in self.events]
        if ends != sorted(ends):
            raise TraceFormatError(f"trace {self.query_id!r}: events not sorted by end_s")

    def stretched(self, multiplier: float) -> QueryTrace:
        """All retrieval times scaled by `multiplier` (the paper's delay multiplier)."""
        if multiplier <= 0:
            raise TraceFormatError(f"delay multiplier must be > 0, got {multiplier}")
        events = tuple(
            replace(e, start_s=e.start_s * multiplier, end_s=e.end_s * multiplier)
            for e in self.events
        )
        return replace(self, events=events)

    def total_context_tokens(self) -> int:
        """Tokens of the final prompt: all chunks (append) or the last doc set (replace)."""
        if self.shape == "vector":
            return self.events[-1].num_tokens
        return sum(e.num_tokens for e in self.events) + self.question_tokens

    @property
    def duration_s(self) -> float:
        return self.events[-1].end_s


def lcp_tokens(
    old_doc_ids: Sequence[str], new_doc_ids: Sequence[str], doc_tokens: Mapping[str, int]
) -> int:
    """Tokens of the longest common doc prefix of two ordered doc-id lists."""
    total = 0
    for old, new in zip(old_doc_ids, new_doc_ids):
        if old != new:
            break
        total += doc_tokens[old]
    return total


def poisson_arrivals(n: int, qps: float, seed: int) -> list[float]:
    """Arrival times (s) of `n` queries with exponential gaps at rate `qps`, first at 0."""
    if n < 0 or qps <= 0:
        raise TraceFormatError(f"need n >= 0 and qps > 0, got n={n}, qps={qps}")
    gaps = np.random.default_rng(seed).exponential(1.0 / qps, size=n)
    if n:
        gaps[0] = 0.0
    return [float(t) for t in np.cumsum(gaps)]


def _lognormal(rng: np.random.Generator, median: float, mean: float, size=None):
    # mean = median * exp(sigma^2 / 2)
    sigma = float(np.sqrt(2.0 * np.log(max(mean / median, 1.0 + 1e-9))))
    return rng.lognormal(np.log(median), sigma, size=size)


CRAWLER_SHAPE = dict(
    mean_scrapes=6.9,  # + 1 search chunk = ~7.9 chunks
    gap_median_s=0.70, gap_mean_s=1.05,
    search_s=2.0,  # time to the first (search) chunk
    search_tokens=600, page_tokens=1200,  # ~600 + 6.9 * 1200 ~ 8.9k tokens
    question_tokens=30, output_tokens=128, tokens_scale=1.0,
)
VECTOR_SHAPE = dict(
    mean_updates=4.4,
    fast_gap_median_s=0.026, slow_gap_median_s=3.2, slow_fraction=0.3,
    first_s=0.15, top_k=10, doc_tokens=290,  # ~2.9k-token contexts, ~13k summed over updates
    question_tokens=30, output_tokens=128, tokens_scale=1.0,
)


def _shape(defaults: dict, overrides: dict) -> dict:
    unknown = set(overrides) - set(defaults)
    if unknown:
        raise TraceFormatError(f"unknown shape parameters {sorted(unknown)}; valid: {sorted(defaults)}")
    return {**defaults, **overrides}


def _scaled(tokens: float, scale: float) -> int:
    return max(1, int(round(tokens * scale)))


def synthetic_crawler_traces(n: int, seed: int, **shape_overrides) -> list[QueryTrace]:
    """Crawler-shaped traces: a search chunk, then page scrapes with lognormal gaps."""
    p = _shape(CRAWLER_SHAPE, shape_overrides)
    rng = np.random.default_rng(seed)
    traces = []
    for q in range(n):
        scrapes = max(1, int(rng.poisson(p["mean_scrapes"])))
        t = float(rng.uniform(0.5, 1.5) * p["search_s"])
        events = [TraceEvent(0.0, t, ContextOp.APPEND, _scaled(rng.uniform(0.5, 1.5) * p["search_tokens"],
                             p["tokens_scale"]), doc_ids=(f"q{q}-search",), source="tavily_search")]
        for i in range(scrapes):
            gap = float(_lognormal(rng, p["gap_median_s"], p["gap_mean_s"]))
            tokens = _lognormal(rng, p["page_tokens"] * 0.85, p["page_tokens"])
            events.append(TraceEvent(t, t + gap, ContextOp.APPEND, _scaled(tokens, p["tokens_scale"]),
                                     doc_ids=(f"q{q}-page{i}",), source="page_scrape"))
            t += gap
        traces.append(QueryTrace(f"crawler-{seed}-{q}", "crawler", f"synthetic crawler query {q}",
                                 tuple(events), _scaled(p["question_tokens"], p["tokens_scale"]),
                                 p["output_tokens"]))
    return traces


def synthetic_vector_traces(n: int, seed: int, **shape_overrides) -> list[QueryTrace]:
    """Vector-search traces: refinements of a top-k list that mostly change only its tail."""
    p = _shape(VECTOR_SHAPE, shape_overrides)
    rng = np.random.default_rng(seed)
    traces = []
    for q in range(n):
        updates = max(1, int(rng.poisson(p["mean_updates"] - 1)) + 1)
        doc_tokens: dict[str, int] = {}
        fresh = iter(range(10**9))

        def new_doc() -> str:
            doc = f"q{q}-d{next(fresh)}"
            doc_tokens[doc] = _scaled(_lognormal(rng, p["doc_tokens"] * 0.9, p["doc_tokens"]),
                                      p["tokens_scale"])
            return doc

        docs = [new_doc() for _ in range(p["top_k"])]
        question = _scaled(p["question_tokens"], p["tokens_scale"])
        t = float(rng.uniform(0.5, 1.5) * p["first_s"])
        events = []
        for u in range(updates):
            if u:
                slow = rng.random() < p["slow_fraction"]
                median = p["slow_gap_median_s"] if slow else p["fast_gap_median_s"]
                t += float(_lognormal(rng, median, median * 1.3))
                keep = int(rng.integers(p["top_k"] // 2, p["top_k"]))  # stable order: tail changes
                docs = docs[:keep] + [new_doc() for _ in range(p["top_k"] - keep)]
            tokens = sum(doc_tokens[d] for d in docs) + question
            events.append(TraceEvent(events[-1].end_s if events else 0.0, t, ContextOp.REPLACE, tokens,
                                     doc_ids=tuple(docs), source="vector"))
        traces.append(QueryTrace(f"vector-{seed}-{q}", "vector", f"synthetic vector query {q}",
                                 tuple(events), question, p["output_tokens"], doc_tokens))
    return traces


def _approx_tokens(text: str) -> int:
    return max(1, round(len(text.split()) * 1.3))


def read_crawler_csv(path, count_tokens: Callable[[str], int] = _approx_tokens,
                     question_tokens: int = 30, output_tokens: int = 128) -> list[QueryTrace]:
    """Read crawler rows (`type,query,content,startTime,endTime[,numTokens]`), one trace per query."""
    by_query: dict[str, list[TraceEvent]] = {}
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        _require_columns(reader, {"type", "query", "content", "startTime", "endTime"}, path)
        for row in reader:
            content = row["content"] or ""
            tokens = int(row["numTokens"]) if row.get("numTokens") else count_tokens(content)
            by_query.setdefault(row["query"], []).append(TraceEvent(
                _float(row["startTime"], path), _float(row["endTime"], path), ContextOp.APPEND, tokens,
                text=content, doc_ids=(row["type"],), source=row["type"]))
    return [QueryTrace(f"{Path(path).stem}-{i}", "crawler", query,
                       tuple(sorted(events, key=lambda e: e.end_s)), question_tokens, output_tokens)
            for i, (query, events) in enumerate(by_query.items())]


def write_crawler_csv(traces: Sequence[QueryTrace], path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["type", "query", "content", "startTime", "endTime", "numTokens"])
        for trace in traces:
            for e in trace.events:
                writer.writerow([e.source, trace.query, e.text, repr(e.start_s), repr(e.end_s),
                                 e.num_tokens])


def read_vector_csv(path, doc_tokens: Mapping[str, int] | Callable[[str], int] | None = None,
                    question_tokens: int = 30, output_tokens: int = 128,
                    default_doc_tokens: int = 290) -> list[QueryTrace]:
    """Read vector rows (`StartTime_us,EndTime_us,PipelinePool[,query]`); tokens per doc from
    `doc_tokens` (mapping or callable; `default_doc_tokens` for docs it does not know)."""
    by_query: dict[str, list[tuple[float, float, tuple[str, ...]]]] = {}
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        _require_columns(reader, {"StartTime_us", "EndTime_us", "PipelinePool"}, path)
        for row in reader:
            pool = tuple(str(d) for d in _parse_pool(row["PipelinePool"], path))
            by_query.setdefault(row.get("query") or Path(path).stem, []).append(
                (_float(row["StartTime_us"], path) / 1e6, _float(row["EndTime_us"], path) / 1e6, pool))
    traces = []
    for i, (query, rows) in enumerate(by_query.items()):
        tokens = {d: _doc_tokens(d, doc_tokens, default_doc_tokens) for _, _, pool in rows for d in pool}
        events = tuple(TraceEvent(s, e, ContextOp.REPLACE, sum(tokens[d] for d in pool) + question_tokens,
                                  doc_ids=pool, source="vector")
                       for s, e, pool in sorted(rows, key=lambda r: r[1]))
        traces.append(QueryTrace(f"{Path(path).stem}-{i}", "vector", query, events,
                                 question_tokens, output_tokens, tokens))
    return traces


def write_vector_csv(traces: Sequence[QueryTrace], path) -> None:
    """One file; a `query` column tells the queries apart."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["StartTime_us", "EndTime_us", "PipelinePool", "query"])
        for trace in traces:
            for e in trace.events:
                writer.writerow([round(e.start_s * 1e6), round(e.end_s * 1e6),
                                 json.dumps(list(e.doc_ids)), trace.query])


def _doc_tokens(doc: str, source, default: int) -> int:
    if source is None:
        return default
    if callable(source):
        return int(source(doc))
    return int(source.get(doc, default))


def _parse_pool(text: str, path) -> list:
    try:
        pool = json.loads(text)
    except json.JSONDecodeError:
        try:
            pool = ast.literal_eval(text)
        except (ValueError, SyntaxError) as exc:
            raise TraceFormatError(f"{path}: bad PipelinePool {text!r}") from exc
    if not isinstance(pool, (list, tuple)):
        raise TraceFormatError(f"{path}: PipelinePool must be a list, got {text!r}")
    return list(pool)


def _float(text: str, path) -> float:
    try:
        return float(text)
    except (TypeError, ValueError) as exc:
        raise TraceFormatError(f"{path}: not a number: {text!r}") from exc


def _require_columns(reader: csv.DictReader, needed: set[str], path) -> None:
    missing = needed - set(reader.fieldnames or ())
    if missing:
        raise TraceFormatError(f"{path}: missing columns {sorted(missing)}")
