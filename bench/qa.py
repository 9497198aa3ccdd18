"""Answer quality through the whole pipeline: `python -m bench.qa` -> bench/results/qa.json.

Grounded geography questions of three kinds (`stream2llm.data.corpus.load_question_set`: the capital,
a neighbouring country, an official language; each answerable from the country's own summary) go
to `/v1/rag`, once with `prompt_mode` stream and once oneshot, greedy, from each source:
- `vector`: progressive FAISS search over an index holding every grounded country's article; its
  refinements arrive within milliseconds, so streaming prefills little before the question;
- `crawler`: search and fetch pages of the local corpus site (`{"type": "search", "query":
  country}`), pages ~0.7 s apart: the prompt really is streamed while the crawl runs.
Answers are scored by the strict judge (`stream2llm.data.answer_judge`): an accepted answer named outside
the question's words, no refusal, no wrong candidate of the same kind. Accuracy comes with a 95%
Wilson interval, per mode, source and kind (`bench.qa_report`). `--rejudge FILE` re-scores a stored
run of the earlier, capital-only format with the strict judge instead of running anything.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import httpx
from tqdm import tqdm

from bench.qa_report import MODES, make_row, rejudge_legacy, summarize
from bench.results_meta import engine_dtype, legacy_meta, start_run, write_results
from engine.config import DEFAULT_MODEL
from pipeline.config import AppConfig
from pipeline.run.local import local_app
from pipeline.run.rag_client import RagResult, ask
from stream2llm.data.corpus import GroundedQuestion, load_grounded_questions, load_question_set

RESULTS = Path(__file__).parent / "results" / "qa.json"
SOURCES = {"vector": lambda q: {"type": "vector"}, "crawler": lambda q: {"type": "search", "query": q.country}}
QUICK_PER_KIND = 6


def app_config(args, index_path: Path) -> AppConfig:
    tiny = args.model == "tiny"
    return AppConfig.model_validate({
        "model": {"model": args.model, "dtype": args.dtype, "max_model_len": 2048 if tiny else 4096,
                  "kv_cache_memory_bytes": (16 if tiny else 256) << 20},
        "replicas": {"min_replicas": 1, "max_replicas": 1, "num_cpus": 1.0},
        "retrievers": {"vector_index": str(index_path), "vector_top_k": args.top_k,
                       "crawler_max_pages": args.crawler_pages, "site_latency_scale": args.site_latency_scale},
        "limits": {"max_context_tokens": 1800 if tiny else 3500},
    })


def pick_questions(kinds: tuple[str, ...], per_kind: int | None) -> list[GroundedQuestion]:
    """The first `per_kind` grounded questions of each kind (all when None)."""
    questions = load_question_set(kinds)
    return [q for k in kinds for q in [q for q in questions if q.kind == k][:per_kind]]


async def ask_all(base: str, questions, sources: tuple[str, ...], max_tokens: int, concurrency: int,
                  progress: bool = True) -> dict[tuple[int, str, str], RagResult]:
    """Every (question, source, mode), at most `concurrency` at a time."""
    gate = asyncio.Semaphore(concurrency)
    bar = tqdm(total=len(questions) * len(sources) * len(MODES), desc="qa", unit="answer", disable=not progress)
    results: dict[tuple[int, str, str], RagResult] = {}

    async def one(http, i: int, q: GroundedQuestion, source: str, mode: str) -> None:
        async with gate:
            results[i, source, mode] = await ask(http, base, q.question, SOURCES[source](q),
                                                 prompt_mode=mode, max_tokens=max_tokens)
            bar.update()

    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as http:
        await ask(http, base, "What is the capital of France?", {"type": "vector"}, max_tokens=2)  # warm-up
        await asyncio.gather(*(one(http, i, q, s, m) for i, q in enumerate(questions)
                               for s in sources for m in MODES))
    bar.close()
    return results


def resolve_index(args) -> Path:
    if args.index:
        return Path(args.index)
    from retrievers.vector_index import IndexSpec, ensure_index

    return ensure_index(IndexSpec(subset_others=args.index_others)).path


def run_qa(args) -> dict:
    questions = pick_questions(args.kinds, args.per_kind)
    index_path = resolve_index(args)
    started = time.perf_counter()
    with local_app(app_config(args, index_path)) as base:
        ready = time.perf_counter()
        results = asyncio.run(ask_all(base, questions, args.sources, args.max_tokens, args.concurrency,
                                      args.progress))
    rows = [make_row(q, s, {m: results[i, s, m] for m in MODES})
            for i, q in enumerate(questions) for s in args.sources]
    report = summarize(rows)
    report["setup"] = {"kinds": list(args.kinds), "per_kind": args.per_kind, "sources": list(args.sources),
                       "index": str(index_path), "top_k": args.top_k, "crawler_pages": args.crawler_pages,
                       "site_latency_scale": args.site_latency_scale, "max_tokens": args.max_tokens,
                       "temperature": 0.0, "concurrency": args.concurrency, "judge": "stream2llm.data.answer_judge"}
    report["wall_s"] = {"startup": round(ready - started, 1), "questions": round(time.perf_counter() - ready, 1)}
    return report


def rejudge(path: Path) -> dict:
    """A stored capital-only run re-scored by the strict judge; its answers and timings are kept."""
    old = json.loads(path.read_text(encoding="utf-8"))
    if "sources" in old:
        raise SystemExit(f"{path} is already in the strict judge's format")
    report = summarize(rejudge_legacy(old, {q.country: q for q in load_grounded_questions()}))
    vector = report["sources"]["vector"]
    vector["ttft_p50_s"] = {"stream": old["stream"]["ttft_p50_s"], "oneshot": old["nonstream"]["ttft_p50_s"]}
    vector["tokens_prefilled_before_finish_p50"] = old["stream"].get("tokens_prefilled_before_finish_p50")
    report["setup"] = {**old["setup"], "kinds": ["capital"], "sources": ["vector"],
                       "judge": "stream2llm.data.answer_judge (re-judged; the run used a substring match)"}
    report["wall_s"] = old.get("wall_s")
    report["meta"] = legacy_meta({"model": old["setup"]["model"], "dtype": old["setup"]["dtype"],
                                  "command": "python -m bench.qa", "commit": None},
                                 "answers from a run before metadata was recorded (its file was first "
                                 "committed in 5928324); re-judged with the strict judge by "
                                 "`python -m bench.qa --rejudge <that file>`. Greedy decoding; the index "
                                 "seed is in its folder name (s0).")
    return report


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kinds", type=lambda s: tuple(s.split(",")), default=("capital", "border", "language"))
    p.add_argument("--sources", type=lambda s: tuple(s.split(",")), default=tuple(SOURCES))
    p.add_argument("--per-kind", type=int, default=None, help="first N questions of each kind (default all)")
    p.add_argument("--quick", action="store_true", help=f"{QUICK_PER_KIND} questions per kind, 4 pages per crawl")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--dtype", choices=("bfloat16", "float32"), help="default: the engine's for this machine")
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--top-k", type=int, default=4)
    p.add_argument("--crawler-pages", type=int, default=8)
    p.add_argument("--site-latency-scale", type=float, default=1.0)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--index", default=None, help="an existing index folder (default: the cache's subset index)")
    p.add_argument("--index-others", type=int, default=1000,
                   help="random non-grounded articles in the subset index (grounded ones are always in)")
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--rejudge", type=Path, default=None, help="re-score a stored run; writes --out")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    args = p.parse_args(argv)
    unknown = set(args.sources) - set(SOURCES)
    if unknown:
        p.error(f"unknown sources {sorted(unknown)}; valid: {', '.join(SOURCES)}")
    if args.quick:
        args.per_kind, args.crawler_pages = args.per_kind or QUICK_PER_KIND, min(args.crawler_pages, 4)
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.rejudge:
        report = rejudge(args.rejudge)
        meta = report.pop("meta")
    else:
        meta = start_run(args.model, engine_dtype(args.dtype), seeds=[0])  # greedy; 0 is the index's sampling seed
        report = run_qa(args)
    out = write_results(Path(args.out), report, meta)
    for name, s in report["sources"].items():
        print(json.dumps({"source": name, **{k: s[k] for k in ("questions", "accuracy_stream", "accuracy_oneshot",
                                                                "identical_answers", "same_citations", "errors")}}))
    print(f"wrote {out}")
    return report


if __name__ == "__main__":
    main()
