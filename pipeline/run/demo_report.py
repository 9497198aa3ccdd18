"""What `stream2llm demo` prints: one block per answer, then the closing table (rows are plain dicts,
written as JSON with `--out`)."""

from __future__ import annotations

import json
import statistics

from pipeline.run.rag_client import RagResult
from stream2llm.data.corpus import GroundedQuestion
from stream2llm.data.traces import PromptMode

ANSWER_CHARS = 160
CITATIONS_SHOWN = 9


def cites_country(citations: list[dict], doc_id: str) -> bool:
    """The crawler cites page URLs (.../wiki/<doc_id>), the vector search doc ids: same last part."""
    return any(str(c.get("url_or_doc_id", "")).rsplit("/", 1)[-1] == doc_id for c in citations)


def make_row(question: GroundedQuestion, source_name: str, source: dict, results: dict[str, RagResult]) -> dict:
    s, o = results[PromptMode.STREAM], results[PromptMode.ONESHOT]
    speedup = o.ttft_s / s.ttft_s if s.ttft_s and o.ttft_s else None
    return {
        "country": question.country, "capital": question.capital, "question": question.question,
        "source": source_name, "request_source": source,
        "correct_stream": question.answered_by(s.answer),
        "correct_oneshot": question.answered_by(o.answer),
        "country_page_cited": cites_country(s.citations, question.doc_id),
        "context_tokens": s.final.get("context_tokens"),
        "ttft_stream_s": s.ttft_s, "ttft_oneshot_s": o.ttft_s,
        "engine_ttft_stream_s": s.engine_ttft_s, "engine_ttft_oneshot_s": o.engine_ttft_s,
        "speedup": speedup, "same_answer": s.ok and o.ok and s.answer == o.answer,
        # the crawler appends pages as they arrive, so the two runs may see them in another order
        "same_sources": [c.get("source_id") for c in s.citations] == [c.get("source_id") for c in o.citations],
        "source_errors": {PromptMode.STREAM: s.source_errors, PromptMode.ONESHOT: o.source_errors},  # pages that failed
        "citations": [{k: c.get(k) for k in ("source_id", "title", "url_or_doc_id")} for c in s.citations],
        PromptMode.STREAM: s.summary(), PromptMode.ONESHOT: o.summary(),
    }


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def _short(text: str, limit: int = ANSWER_CHARS) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def print_answer(number: int, row: dict) -> None:
    s, o = row[PromptMode.STREAM], row[PromptMode.ONESHOT]
    print(f"\nQ{number} {row['question']}  [{row['source']}: {json.dumps(row['request_source'])}]", flush=True)
    for mode, result in (("stream", s), ("one-shot", o)):
        status = "" if result["ok"] else f"  FAILED ({result['status']}: {result['error']})"
        print(f"  {mode:<9}\"{_short(result['answer'])}\"{status}")
        print(f"  {'':<9}TTFT {_ms(result['ttft_s'])} (engine {_ms(result['engine_ttft_s'])}), "
              f"retrieval {result['retrieval_s'] or 0:.2f} s, {_count(result['context_tokens'])} context tokens")
    cites = [f"{c['source_id']}: {c['title']}" for c in row["citations"]]
    more = f" (+{len(cites) - CITATIONS_SHOWN} more)" if len(cites) > CITATIONS_SHOWN else ""
    print(f"  cited    {'; '.join(cites[:CITATIONS_SHOWN])}{more}")
    if any(row["source_errors"].values()):
        counts = ", ".join(f"{n} in the {mode} run" for mode, n in row["source_errors"].items() if n)
        print(f"  note     pages not fetched (source errors): {counts}")
    if not row["country_page_cited"]:
        print(f"  note     the {row['country']} article is not among the sources")


HEADER = (("country", 14), ("source", 8), ("correct s/o", 12), ("page", 5), ("ctx tok", 8),
          ("TTFT stream", 12), ("TTFT 1-shot", 12), ("speedup", 8), ("same", 5))


def _cells(row: dict) -> tuple:
    yes = {True: "yes", False: "no"}
    speedup = "-" if row["speedup"] is None else f"{row['speedup']:.1f}x"
    return (row["country"], row["source"], f"{yes[row['correct_stream']]}/{yes[row['correct_oneshot']]}",
            yes[row["country_page_cited"]], row["context_tokens"] if row["context_tokens"] is not None else "-",
            _ms(row["ttft_stream_s"]), _ms(row["ttft_oneshot_s"]), speedup,
            yes[row["same_answer"]] + ("" if row["same_sources"] else "*"))


def print_table(rows: list[dict]) -> None:
    line = "".join(f"{name:>{width}}" if i > 1 else f"{name:<{width}}" for i, (name, width) in enumerate(HEADER))
    print(f"\n{line}\n{'-' * len(line)}")
    for row in rows:
        cells = _cells(row)
        print("".join(f"{c!s:>{w}}" if i > 1 else f"{c!s:<{w}}" for i, (c, (_, w)) in enumerate(zip(cells, HEADER))))
    for source in dict.fromkeys(r["source"] for r in rows):
        print(_median_line(source, [r for r in rows if r["source"] == source]))
    print("page: the country's article is among the cited sources; same: streamed and one-shot answers are identical"
          + ("\n*: the pages arrived in another order in the two runs, so the prompts differ"
             if not all(r["same_sources"] for r in rows) else ""))


def _median_line(source: str, rows: list[dict]) -> str:
    stream = [r["ttft_stream_s"] for r in rows if r["ttft_stream_s"] is not None]
    oneshot = [r["ttft_oneshot_s"] for r in rows if r["ttft_oneshot_s"] is not None]
    if not stream or not oneshot:
        return f"{source}: no TTFT measured"
    s, o = statistics.median(stream), statistics.median(oneshot)
    correct = sum(r["correct_stream"] for r in rows)
    return (f"{source}: median TTFT {_ms(s)} streamed vs {_ms(o)} one-shot ({o / s:.1f}x); "
            f"{correct}/{len(rows)} correct (streamed)")


def failed_requests(rows: list[dict]) -> int:
    return sum(not row[mode]["ok"] for row in rows for mode in PromptMode)
