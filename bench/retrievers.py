"""Retriever benchmark: `python -m bench.retrievers [--subset N]` -> bench/results/retrievers.json.

Crawler: pages/s and trafilatura ms/page against the local site on loopback (zero latency, so the
crawler itself is measured), plus a run with the workload's latency for time to first page.
Vector: time to the first progressive result vs exact search, recall@5 on the grounded geography
questions, embedding throughput. Recorded traces go to the cache folder (paper CSV formats).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path

from bench.results_meta import start_run, write_results
from bench.stats import percentile
from retrievers.embedding import MODEL_PACKAGE
from retrievers.chunking import whitespace_count
from stream2llm.data.corpus import load_documents, load_grounded_questions
from retrievers.crawler import Crawler
from retrievers.crawler_config import CrawlerConfig
from retrievers.events import AppendChunk, Done, ReplaceContext
from retrievers.extract import extract_main_text
from retrievers.local_site import LocalSite, SiteConfig
from retrievers.recording import TraceRecorder, write_traces
from retrievers.site_pages import article_page
from stream2llm.paths import cache_path

RESULTS = Path(__file__).parent / "results" / "retrievers.json"


async def bench_crawler(queries: list[str], latency_queries: int) -> dict:
    out = {}
    async with LocalSite(SiteConfig(latency_scale=0.0)) as site:
        config = CrawlerConfig(search_url=site.search_url, allowlist=(site.allowlist_entry,), max_pages=8)
        start = time.perf_counter()
        pages, extract_ms = 0, []
        for query in queries:
            async for event in Crawler(config, whitespace_count).stream(query):
                if isinstance(event, Done):
                    pages += event.summary["pages"]
                    extract_ms.append(event.summary["extract_ms_mean"])
        wall = time.perf_counter() - start
        out["zero_latency"] = {"queries": len(queries), "pages": pages, "wall_s": round(wall, 3),
                               "pages_per_s": round(pages / wall, 2),
                               "extract_ms_per_page_in_crawl": round(statistics.mean(extract_ms), 2)}
    out["extract_ms_per_page_serial"] = _serial_extract_ms(60)
    async with LocalSite(SiteConfig(latency_scale=1.0, seed=0)) as site:
        config = CrawlerConfig(search_url=site.search_url, allowlist=(site.allowlist_entry,), max_pages=8)
        first, total, traces = [], [], []
        for i, query in enumerate(queries[:latency_queries]):
            recorder = TraceRecorder(f"crawl-{i}", "crawler", query, whitespace_count(query))
            start = time.perf_counter()
            firsts = []
            async for event in recorder.wrap(Crawler(config, whitespace_count).stream(query)):
                if isinstance(event, AppendChunk) and event.source_id != "search":
                    firsts.append(time.perf_counter() - start)
            first.append(firsts[0] if firsts else None)
            total.append(time.perf_counter() - start)
            traces.append(recorder.trace())
        path = write_traces(traces, cache_path("traces", "recorded_crawler.csv"))
        out["workload_latency"] = {"queries": len(total), "first_page_s_median": round(statistics.median(first), 3),
                                   "query_s_median": round(statistics.median(total), 3), "trace_csv": str(path)}
    return out


def _serial_extract_ms(n: int) -> float:
    """One thread, the grounded countries' pages (what the crawl fetches), after one warm-up call."""
    by_id = {d.doc_id: d for d in load_documents()}
    docs = [by_id[q.doc_id] for q in load_grounded_questions()[:n]]
    html = [article_page(d, docs[:8]) for d in docs]
    extract_main_text(html[0], "http://127.0.0.1/warmup")
    start = time.perf_counter()
    for page, doc in zip(html, docs):
        extract_main_text(page, f"http://127.0.0.1/wiki/{doc.doc_id}")
    return round(1000 * (time.perf_counter() - start) / n, 2)


async def bench_vector(subset: int | None, k: int) -> dict:
    from retrievers.embedding import Embedder
    from retrievers.vector import VectorRetriever, exact_top_k
    from retrievers.vector_index import IndexSpec, ensure_index, embed_chunks, chunk_documents

    embedder = Embedder()
    sample = chunk_documents(load_documents()[1000:1128], 200, embedder.count_tokens)
    embedder.embed([c.text for c in sample[:8]])  # warm-up: the first batch pays one-off costs
    _, docs_per_s = embed_chunks(embedder, sample, progress=False)
    spec = IndexSpec(subset_others=subset)
    index = ensure_index(spec, embedder=embedder)
    retriever = VectorRetriever(index, embedder, k=k, count_tokens=embedder.count_tokens)
    rows, traces = [], []
    for q in load_grounded_questions():
        recorder = TraceRecorder(q.country, "vector", q.question, embedder.count_tokens(q.question))
        events = [e async for e in recorder.wrap(retriever.stream(q.question))]
        traces.append(recorder.trace())
        replaces = [e for e in events if isinstance(e, ReplaceContext)]
        summary = events[-1].summary
        start = time.perf_counter()
        vector = embedder.embed([q.question])
        embedded = time.perf_counter()
        exact = exact_top_k(index, vector, k)
        exact_search_s = time.perf_counter() - embedded
        rows.append({"first_s": summary["first_result_s"], "final_s": summary["elapsed_s"],
                     "exact_s": time.perf_counter() - start, "exact_search_s": exact_search_s,
                     "first_search_s": summary["first_result_s"] - summary["embed_s"],
                     "final_search_s": summary["elapsed_s"] - summary["embed_s"],
                     "embed_s": summary["embed_s"], "updates": len(replaces),
                     "hit_final": q.doc_id in {c.url_or_doc_id for c in replaces[-1].chunks},
                     "hit_first": q.doc_id in {c.url_or_doc_id for c in replaces[0].chunks},
                     "exact_match": set(replaces[-1].source_ids) == {index.chunks[i].chunk_id for i in exact}})
    path = write_traces(traces, cache_path("traces", "recorded_vector.csv"))
    ms = lambda key, q: round(1000 * percentile([r[key] for r in rows], 100 * q), 3)  # noqa: E731
    return {"index": index.meta["name"], "documents": index.meta["documents"], "chunks": index.meta["chunks"],
            "nlist": index.nlist, "on_gpu": retriever.on_gpu, "k": k, "questions": len(rows),
            "embedding_chunks_per_s": round(docs_per_s, 2), "index_build_chunks_per_s": index.meta["embed_chunks_per_s"],
            "first_result_ms_p50": ms("first_s", 0.5), "final_result_ms_p50": ms("final_s", 0.5),
            "exact_search_ms_p50": ms("exact_s", 0.5), "query_embed_ms_p50": ms("embed_s", 0.5),
            "search_only_first_result_ms_p50": ms("first_search_s", 0.5),
            "search_only_all_probes_ms_p50": ms("final_search_s", 0.5),
            "search_only_exact_bruteforce_ms_p50": ms("exact_search_s", 0.5),
            "updates_mean": round(statistics.mean(r["updates"] for r in rows), 2),
            f"recall_at_{k}": round(statistics.mean(r["hit_final"] for r in rows), 4),
            f"recall_at_{k}_first_event": round(statistics.mean(r["hit_first"] for r in rows), 4),
            "final_equals_exact": round(statistics.mean(r["exact_match"] for r in rows), 4),
            "trace_csv": str(path)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subset", type=int, default=3000,
                        help="random non-grounded articles indexed with the 152 grounded ones; -1 = full corpus")
    parser.add_argument("--crawl-queries", type=int, default=30)
    parser.add_argument("--latency-queries", type=int, default=5)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--skip-vector", action="store_true")
    parser.add_argument("--skip-crawler", action="store_true")
    args = parser.parse_args(argv)
    queries = [q.question for q in load_grounded_questions()[: args.crawl_queries]]
    # the site's latencies and the index's subset are drawn with seed 0 (SiteConfig, IndexSpec)
    meta = start_run(model=MODEL_PACKAGE if not args.skip_vector else None, dtype=None, seeds=[0])
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    if args.skip_crawler or args.skip_vector:  # the other half is kept from an older run
        results["meta_note"] = "one half rerun with --skip-crawler/--skip-vector: meta describes the last run only"
    else:
        results.pop("meta_note", None)
    if not args.skip_crawler:
        results["crawler"] = asyncio.run(bench_crawler(queries, args.latency_queries))
        print(json.dumps(results["crawler"], indent=2), flush=True)
    if not args.skip_vector:
        subset = None if args.subset < 0 else args.subset
        results["vector"] = asyncio.run(bench_vector(subset, args.k))
    results.pop("machine", None)  # an older run's hand-written machine note: meta records it now
    results["omp_num_threads"] = os.environ.get("OMP_NUM_THREADS")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    write_results(RESULTS, results, meta)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
