"""Answer quality through the whole pipeline: `python -m bench.qa` -> bench/results/qa.json.

Every grounded geography question (DESIGN.md section 5) goes to `/v1/rag` with the vector source
(progressive FAISS search over an index that holds all grounded countries' articles), once with
`prompt_mode` stream and once oneshot, greedy. Reported: accuracy (the expected capital appears in
the answer; case- and accent-insensitive, `accuracy_strict` is case-insensitive only), per mode,
whether both modes gave the same answer, and TTFT p50 per mode (client side, `rag_client.ask`).
Both modes are designed to end on the same prompt tokens, so a differing answer is either
numerics (bf16 rounding at different chunk boundaries; float32 should remove it) or a bug: each
differing question is listed with both answers and both modes' `context_tokens` (a one-shot
prompt's count includes the question, a streamed session's does not: `same_prompt_length` adds the
question's tokens, from the model's tokenizer, before comparing).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

import httpx
from tqdm import tqdm

from pipeline.config import AppConfig
from pipeline.local import local_app
from pipeline.rag_client import RagResult, ask
from retrievers.corpus import GroundedQuestion, load_grounded_questions

RESULTS = Path(__file__).parent / "results" / "qa.json"
MODES = ("stream", "oneshot")



def app_config(model: str, dtype: str, index_path: Path, top_k: int) -> AppConfig:
    tiny = model == "tiny"
    return AppConfig.model_validate({
        "model": {"model": model, "dtype": dtype, "max_model_len": 2048 if tiny else 4096,
                  "kv_cache_memory_bytes": (16 if tiny else 256) << 20},
        "replicas": {"min_replicas": 1, "max_replicas": 1, "num_cpus": 1.0},
        "retrievers": {"vector_index": str(index_path), "vector_top_k": top_k},
        "limits": {"max_context_tokens": 1800 if tiny else 3500},
    })


async def ask_all(base: str, questions, max_tokens: int, concurrency: int,
                  progress: bool = True) -> dict[tuple[int, str], RagResult]:
    """Every (question, mode) pair, at most `concurrency` at a time, in question order."""
    gate = asyncio.Semaphore(concurrency)
    bar = tqdm(total=len(questions) * len(MODES), desc="qa", unit="answer", disable=not progress)
    results: dict[tuple[int, str], RagResult] = {}

    async def one(http, i: int, q: GroundedQuestion, mode: str) -> None:
        async with gate:
            results[i, mode] = await ask(http, base, q.question, {"type": "vector"},
                                         prompt_mode=mode, max_tokens=max_tokens)
            bar.update()

    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as http:
        await ask(http, base, "What is the capital of France?", {"type": "vector"}, max_tokens=2)  # warm-up
        await asyncio.gather(*(one(http, i, q, m) for i, q in enumerate(questions) for m in MODES))
    bar.close()
    return results


def _rate(flags: list[bool]) -> float:
    return round(sum(flags) / len(flags), 4) if flags else 0.0


def _p50(values) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 4) if values else None


def _mode_stats(results, mode: str, n: int) -> dict:
    return {"ttft_p50_s": _p50(results[i, mode].ttft_s for i in range(n)),
            "engine_ttft_p50_s": _p50(results[i, mode].engine_ttft_s for i in range(n))}


def footer_lengths(model: str, questions) -> list[int]:
    """Tokens of each question's closing piece: a one-shot prompt's `context_tokens` counts it, a
    streamed session's (the context before the question) does not."""
    from transformers import AutoTokenizer

    from engine.models import resolve_model
    from engine.prompt import RagPrompt

    prompt = RagPrompt(AutoTokenizer.from_pretrained(resolve_model(model, prepare=False)))
    return [len(prompt.footer_ids(q.question)) for q in questions]


def summarize(questions, results: dict[tuple[int, str], RagResult], footers: list[int]) -> dict:
    rows, differing = [], []
    for i, q in enumerate(questions):
        s, o = results[i, "stream"], results[i, "oneshot"]
        stream_prompt = s.final.get("context_tokens")
        row = {"country": q.country, "capital": q.capital, "question": q.question,
               "stream": s.answer, "oneshot": o.answer,
               "stream_correct": q.answered_by(s.answer), "oneshot_correct": q.answered_by(o.answer),
               "strict_correct": [q.answered_by(r.answer, accent_sensitive=True) for r in (s, o)],
               "stream_context_tokens": s.final.get("context_tokens"),
               "oneshot_context_tokens": o.final.get("context_tokens"),
               "same_prompt_length": stream_prompt is not None
               and stream_prompt + footers[i] == o.final.get("context_tokens"),
               "stream_citations": [c.get("source_id") for c in s.citations],
               "oneshot_citations": [c.get("source_id") for c in o.citations],
               "errors": [r.error for r in (s, o) if r.error],
               "identical": s.ok and o.ok and s.answer == o.answer}
        rows.append(row)
        if not row["identical"]:
            differing.append(row)
    ok = [r for r in rows if not r["errors"]]
    stream = [r["stream_correct"] for r in rows]
    oneshot = [r["oneshot_correct"] for r in rows]
    strict = [ok for r in rows for ok in r.pop("strict_correct")]
    identical = sum(r["identical"] for r in rows)
    return {
        "questions": len(rows), "answered_both": len(ok),
        "errors": sum(len(r["errors"]) for r in rows),
        "accuracy": _rate(stream + oneshot), "accuracy_strict": _rate(strict),
        "accuracy_stream": _rate(stream), "accuracy_nonstream": _rate(oneshot),
        "identical_answers": identical, "identical_fraction": _rate([r["identical"] for r in rows]),
        "same_prompt_length": sum(r["same_prompt_length"] for r in rows),
        "same_citations": sum(r["stream_citations"] == r["oneshot_citations"] for r in rows),
        "differing": differing,
        "stream": {**_mode_stats(results, "stream", len(rows)),
                   # vector refinements replace the context's tail: how much prefill ran early vs was redone
                   "tokens_prefilled_before_finish_p50": _p50(
                       results[i, "stream"].final.get("tokens_prefilled_before_finish") for i in range(len(rows))),
                   "tokens_invalidated_p50": _p50(
                       results[i, "stream"].final.get("tokens_invalidated") for i in range(len(rows)))},
        "nonstream": _mode_stats(results, "oneshot", len(rows)),
        "rows": rows,
    }


def resolve_index(args) -> Path:
    if args.index:
        return Path(args.index)
    from retrievers.vector_index import IndexSpec, ensure_index

    return ensure_index(IndexSpec(subset_others=args.index_others)).path


def run_qa(args) -> dict:
    questions = load_grounded_questions()[: args.questions]
    index_path = resolve_index(args)
    config = app_config(args.model, args.dtype, index_path, args.top_k)
    started = time.perf_counter()
    with local_app(config) as base:
        ready = time.perf_counter()
        results = asyncio.run(ask_all(base, questions, args.max_tokens, args.concurrency, args.progress))
    report = summarize(questions, results, footer_lengths(args.model, questions))
    report["setup"] = {"model": args.model, "dtype": args.dtype, "source": {"type": "vector"},
                       "index": str(index_path), "top_k": args.top_k, "max_tokens": args.max_tokens,
                       "temperature": 0.0, "concurrency": args.concurrency,
                       "matching": "expected capital in the answer, case- and accent-insensitive (NFKD)"}
    report["wall_s"] = {"startup": round(ready - started, 1), "questions": round(time.perf_counter() - ready, 1)}
    return report


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--questions", type=int, default=None, help="first N grounded questions (default all)")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--top-k", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--index", default=None, help="an existing index folder (default: the cache's subset index)")
    p.add_argument("--index-others", type=int, default=1000,
                   help="random non-grounded articles in the subset index (grounded ones are always in)")
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--no-progress", dest="progress", action="store_false")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    report = run_qa(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    keys = ("questions", "accuracy", "accuracy_stream", "accuracy_nonstream", "identical_answers", "errors")
    print(json.dumps({k: report[k] for k in keys} | {"ttft_p50_s": {m: report[m]["ttft_p50_s"]
                                                                     for m in ("stream", "nonstream")}}))
    for row in report["differing"]:
        print(f"differs: {row['question']}\n  stream:  {row['stream']!r}\n  oneshot: {row['oneshot']!r}")
    print(f"wrote {out}")
    return report


if __name__ == "__main__":
    main()
