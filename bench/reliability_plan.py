"""The sessions of a `bench.reliability` run, planned before it starts: seeded arrival times,
sources (inline documents, corpus ids, crawler and vector trace replays, streaming-input chunks) and
the clients that will leave on purpose; trace files are written to the run's trace folder."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from bench.http_replay import write_request_traces
from stream2llm.data.corpus import documents_by_id, load_grounded_questions
from stream2llm.data.traces import poisson_arrivals, synthetic_crawler_traces, synthetic_vector_traces

# Trace shapes scaled to the tiny model's 2,048-token context: a few hundred tokens per chunk.
CRAWLER_SHAPE = dict(mean_scrapes=3, search_s=0.5, search_tokens=120, page_tokens=160,
                     gap_median_s=0.6, gap_mean_s=0.8)
VECTOR_SHAPE = dict(top_k=3, doc_tokens=120, first_s=0.2, slow_gap_median_s=1.0)


@dataclass
class Planned:
    index: int
    at_s: float
    kind: str          # documents | corpus | crawler | vector | streams
    question: str
    source: dict
    leave_on: str | None  # None | "context" (mid-retrieval) | "token" (mid-answer)
    max_tokens: int


def _stream_chunks(rng: random.Random, docs) -> dict:
    """A client-side retrieval: three passages sent as chunks two seconds apart."""
    return {"type": "streams", "chunks": [d.text[:600] for d in rng.sample(docs, 3)], "gap_s": 2.0}


def plan_sessions(spec, trace_dir: Path) -> list[Planned]:
    """Seeded arrivals, sources and disconnect roles; trace files written to `trace_dir`."""
    rng = random.Random(spec.seed)
    arrivals = poisson_arrivals(spec.sessions, spec.sessions / spec.duration_s, spec.seed)
    n_streams = round(spec.streams_share * spec.sessions)
    kinds = [("documents", "corpus", "crawler", "vector")[i % 4] for i in range(spec.sessions - n_streams)]
    kinds += ["streams"] * n_streams
    rng.shuffle(kinds)
    crawler = write_request_traces(synthetic_crawler_traces(spec.sessions, spec.seed, **CRAWLER_SHAPE),
                                   trace_dir, "crawler")
    vector = write_request_traces(synthetic_vector_traces(spec.sessions, spec.seed, **VECTOR_SHAPE),
                                  trace_dir, "vector")
    docs = list(documents_by_id().values())
    questions = load_grounded_questions()
    n_retrieval = round(spec.leave_mid_retrieval * spec.sessions)
    n_answer = round(spec.leave_mid_answer * spec.sessions)
    # mid-retrieval leavers need a retrieval that takes a while: trace sources
    slow = [i for i, k in enumerate(kinds) if k in ("crawler", "vector")]
    leave_retrieval = set(rng.sample(slow, min(n_retrieval, len(slow))))
    rest = [i for i, k in enumerate(kinds) if i not in leave_retrieval and k != "streams"]
    leave_answer = set(rng.sample(rest, min(n_answer, len(rest))))
    plans = []
    for i, (at, kind) in enumerate(zip(arrivals, kinds)):
        q = questions[i % len(questions)]
        if kind == "documents":
            source = {"type": "documents", "documents": [d.text for d in rng.sample(docs, 2)]}
        elif kind == "streams":
            source = _stream_chunks(rng, docs)
        elif kind == "corpus":
            source = {"type": "corpus", "doc_ids": [q.doc_id, rng.choice(docs).doc_id]}
        else:
            name, _ = (crawler if kind == "crawler" else vector)[i]
            source = {"type": "trace", "trace": name}
        leave = "context" if i in leave_retrieval else "token" if i in leave_answer else None
        plans.append(Planned(i, at, kind, q.question, source, leave,
                             64 if leave == "token" else spec.max_tokens))
    return plans
