"""The QA bench's summary (pure): strict verdicts, accuracy with a 95% Wilson interval, agreement of
the two prompt modes, per source and per question kind; and re-judging a stored run.

A row is one (question, source) pair answered in both prompt modes. `identical_answers` counts rows
whose two answers are equal; `same_citations` rows whose modes cited the same documents in the same
order (the crawler's pages can arrive in another order in the two runs, and then the prompts differ:
`identical_given_same_citations` is the agreement on the rows whose prompts could be equal).
"""

from __future__ import annotations

from bench.stats import percentile
from stream2llm.data.answer_judge import wilson_interval
from stream2llm.data.corpus import GroundedQuestion
from stream2llm.data.traces import PromptMode

MODES = tuple(PromptMode)


def accuracy(flags: list[bool]) -> dict:
    """Correct count, n, rate and its 95% Wilson interval."""
    n, k = len(flags), sum(flags)
    ci = wilson_interval(k, n)
    return {"correct": k, "n": n, "rate": round(k / n, 4) if n else None,
            "ci95": [round(v, 4) for v in ci] if ci else None}


def p50(values) -> float | None:
    value = percentile(values, 50)
    return None if value is None else round(value, 4)


def make_row(q: GroundedQuestion, source: str, results: dict) -> dict:
    """One row from the two modes' `RagResult`s (`results[mode]`)."""
    s, o = results[PromptMode.STREAM], results[PromptMode.ONESHOT]
    verdicts = {m: q.verdict(results[m].answer) for m in MODES}
    return {"kind": q.kind, "country": q.country, "expected": q.answer, "question": q.question, "source": source,
            "stream": s.answer, "oneshot": o.answer,
            "stream_correct": verdicts["stream"].correct, "oneshot_correct": verdicts["oneshot"].correct,
            "stream_verdict": verdicts["stream"].reason, "oneshot_verdict": verdicts["oneshot"].reason,
            "stream_context_tokens": s.final.get("context_tokens"), "oneshot_context_tokens": o.final.get("context_tokens"),
            "stream_citations": [c.get("source_id") for c in s.citations],
            "oneshot_citations": [c.get("source_id") for c in o.citations],
            "tokens_prefilled_before_finish": s.final.get("tokens_prefilled_before_finish"),
            "stream_ttft_s": s.ttft_s, "oneshot_ttft_s": o.ttft_s,
            "errors": [r.error for r in (s, o) if r.error],
            "identical": s.ok and o.ok and s.answer == o.answer}


def summarize_rows(rows: list[dict]) -> dict:
    """Accuracy per mode (overall and per kind), agreement and streaming overlap of `rows`."""
    same_cites = [r for r in rows if r["stream_citations"] == r["oneshot_citations"]]
    kinds = sorted({r["kind"] for r in rows})
    return {
        "questions": len(rows), "errors": sum(len(r["errors"]) for r in rows),
        "accuracy_stream": accuracy([r["stream_correct"] for r in rows]),
        "accuracy_oneshot": accuracy([r["oneshot_correct"] for r in rows]),
        "by_kind": {k: {m: accuracy([r[f"{m}_correct"] for r in rows if r["kind"] == k]) for m in MODES}
                    for k in kinds},
        "verdicts": {m: _counts(r[f"{m}_verdict"] for r in rows) for m in MODES},
        "identical_answers": sum(r["identical"] for r in rows),
        "same_citations": len(same_cites),
        "identical_given_same_citations": sum(r["identical"] for r in same_cites),
        "tokens_prefilled_before_finish_p50": p50(r["tokens_prefilled_before_finish"] for r in rows),
        "ttft_p50_s": {m: p50(r[f"{m}_ttft_s"] for r in rows) for m in MODES},
        "differing": [{k: r[k] for k in ("kind", "country", "source", "stream", "oneshot")}
                      for r in rows if not r["identical"]],
    }


def _counts(values) -> dict:
    out: dict = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return dict(sorted(out.items()))


def summarize(rows: list[dict]) -> dict:
    """Per source (`sources`), with every row kept (`rows`)."""
    sources = sorted({r["source"] for r in rows})
    return {"sources": {s: summarize_rows([r for r in rows if r["source"] == s]) for s in sources}, "rows": rows}


def rejudge_legacy(old: dict, questions: dict[str, GroundedQuestion]) -> list[dict]:
    """Rows of a stored run of the earlier format (capital questions, vector source, answers kept)
    with verdicts from the strict judge; timings and citations as stored."""
    rows = []
    for r in old["rows"]:
        q = questions[r["country"]]
        verdicts = {m: q.verdict(r[m]) for m in MODES}
        rows.append({"kind": q.kind, "country": q.country, "expected": q.answer, "question": q.question,
                     "source": "vector", "stream": r["stream"], "oneshot": r["oneshot"],
                     **{f"{m}_correct": verdicts[m].correct for m in MODES},
                     **{f"{m}_verdict": verdicts[m].reason for m in MODES},
                     "old_judge_correct": [r["stream_correct"], r["oneshot_correct"]],
                     **{k: r.get(k) for k in ("stream_context_tokens", "oneshot_context_tokens",
                                              "stream_citations", "oneshot_citations")},
                     "tokens_prefilled_before_finish": None, "stream_ttft_s": None, "oneshot_ttft_s": None,
                     "errors": r["errors"], "identical": r["identical"]})
    return rows
