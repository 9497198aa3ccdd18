"""/v1/rag with the real retrievers over HTTP: the local corpus site (search and crawl), the FAISS
index (progressive vector search) and trace replay, all as Ray actors with streaming generators.

One Serve app with SmolLM2 for the module, so that the vector-search request doubles as the
end-to-end RAG answer: a grounded geography question answered from retrieved Wikipedia text.
"""

import httpx
import pytest

from pipeline_fixtures import parse_sse, serve_app, wait_until
from stream2llm.data.corpus import load_grounded_questions
from retrievers.events import ReplaceContext, collect
from stream2llm.data.traces import synthetic_crawler_traces, write_crawler_csv

pytestmark = pytest.mark.timeout(600)
TOP_K = 3


def _refining_question(index, embedder):
    """A grounded question whose progressive search replaces its top-k at least once, and whose
    final top-k holds the country's article (so the answer is grounded in what was retrieved)."""
    import asyncio

    from retrievers.vector import VectorRetriever

    retriever = VectorRetriever(index, embedder, k=TOP_K)
    for q in load_grounded_questions()[:20]:
        events = asyncio.run(collect(retriever.stream(q.question)))
        replaces = [e for e in events if isinstance(e, ReplaceContext)]
        distinct = {e.source_ids for e in replaces}
        if len(distinct) >= 2 and any(c.url_or_doc_id == q.doc_id for c in replaces[-1].chunks):
            return q
    raise RuntimeError("no grounded question refines its top-k on this index")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from retrievers.embedding import Embedder
    from retrievers.vector_index import IndexSpec, build_index

    root = tmp_path_factory.mktemp("sources")
    embedder = Embedder()
    index = build_index(IndexSpec(subset_others=20, grounded_limit=20, nlist=12), root / "index", embedder,
                        progress=False)
    question = _refining_question(index, embedder)
    traces = root / "traces"
    traces.mkdir()
    trace = synthetic_crawler_traces(1, seed=5, tokens_scale=0.05)[0]
    write_crawler_csv([trace], traces / "synthetic.csv")
    config = {
        "model": {"model": "smollm2", "max_model_len": 4096, "kv_cache_memory_bytes": 256 << 20},
        "replicas": {"min_replicas": 1, "max_replicas": 1, "num_cpus": 1.0, "report_interval_s": 0.5},
        "retrievers": {"crawler_max_pages": 3, "site_latency_scale": 0.1, "vector_index": str(index.path),
                       "vector_top_k": TOP_K, "trace_dir": str(traces), "trace_multiplier": 0.1,
                       "replace_settle_s": 0.0},  # every refinement prefilled: the replace path under test
        "limits": {"max_context_tokens": 3000},
    }
    with serve_app(config) as base:
        yield {"base": base, "question": question, "trace": trace, "warmed": _pools_up_before_any_request()}


def _pools_up_before_any_request() -> set[str]:
    """The retriever pools whose actors are up, once both exist (`retrievers.warm_pools`, the default)."""
    import ray

    from pipeline.control.central import NAMESPACE

    def named():
        found = {kind: n["name"] for n in ray.util.list_named_actors(all_namespaces=True)
                 for kind in ("crawler", f"vector{TOP_K}") if f"_retriever_{kind}_" in n["name"]}
        return found if len(found) == 2 else None

    found = wait_until(named, timeout=240)
    ray.get([ray.get_actor(name, namespace=NAMESPACE).__ray_ready__.remote() for name in found.values()],
            timeout=240)
    return set(found)


def test_retriever_pools_start_with_the_app(setup):
    """The crawler and vector actors were started and up before any request asked for them: the
    first request of a source does not wait for its actor to load its model and index."""
    assert setup["warmed"] == {"crawler", f"vector{TOP_K}"}


def rag(base, question, source, max_tokens=8):
    r = httpx.post(f"{base}/v1/rag", timeout=300, json={
        "question": question, "source": source, "sampling": {"max_tokens": max_tokens}})
    assert r.status_code == 200, r.text
    events = parse_sse(r.text)
    assert events[-1][0] == "final", events[-3:]
    return events


def of(events, name):
    return [d for n, d in events if n == name]


def test_search_on_local_site_streams_pages_then_answers(setup):
    events = rag(setup["base"], "What is the capital of Kenya?", {"type": "search", "query": "Kenya"})
    names = [n for n, _ in events]
    assert names.index("retrieval_done") < names.index("token") < names.index("final")
    contexts = of(events, "context")
    sources = [s for c in contexts for s in c["sources"]]
    assert sources[0]["source_id"] == "search"  # the result list comes first, like Tavily's step
    pages = [s["url_or_doc_id"] for s in sources if s["source_id"] != "search"]
    assert any(u.endswith("/wiki/Kenya") for u in pages) and all(u.startswith("http://127.0.0.1:") for u in pages)
    assert all(c["mode"] == "append" for c in contexts)
    tokens = [c["context_tokens"] for c in contexts]
    assert tokens == sorted(tokens) and tokens[0] > 0
    assert of(events, "retrieval_done")[0]["pages"] == len(set(pages)) <= 3
    final = of(events, "final")[0]
    assert final["citations"] == sources
    # prefill runs while pages arrive; the last ones may still be prefilling when the question comes
    assert 0 <= final["tokens_prefilled_before_finish"] <= tokens[-1] and final["tokens_invalidated"] == 0


def test_crawl_seed_urls_on_the_site_and_blocked_seed_is_a_source_error(setup):
    blocked = "http://127.0.0.1:9/wiki/Kenya"  # loopback but not allowlisted: refused before connecting
    events = rag(setup["base"], "What is the capital of Peru?",
                 {"type": "crawl", "seed_urls": ["/wiki/Peru", blocked]})
    pages = [s["url_or_doc_id"] for c in of(events, "context") for s in c["sources"]]
    assert pages and all(u.endswith("/wiki/Peru") for u in pages)
    errors = of(events, "source_error")
    assert [e["source"] for e in errors] == [blocked] and errors[0]["reason"]
    assert of(events, "final")[0]["citations"][0]["title"]


def test_vector_search_replaces_context_and_smollm2_answers_grounded(setup):
    q = setup["question"]
    events = rag(setup["base"], q.question, {"type": "vector", "query": q.question}, max_tokens=32)
    contexts = of(events, "context")
    assert len(contexts) >= 2 and all(c["mode"] == "replace" for c in contexts)
    assert all(len(c["sources"]) == TOP_K for c in contexts)
    assert len({tuple(s["source_id"] for s in c["sources"]) for c in contexts}) >= 2  # refined
    final = of(events, "final")[0]
    assert final["tokens_invalidated"] > 0  # a refinement changed the tail of the prefilled context
    assert final["citations"] == contexts[-1]["sources"]
    assert any(c["url_or_doc_id"] == q.doc_id for c in final["citations"])
    answer = "".join(d["text"] for d in of(events, "token"))
    assert q.capital in answer, (q.question, answer)


def test_trace_replay_streams_every_recorded_chunk(setup):
    trace = setup["trace"]
    events = rag(setup["base"], "Summarize.", {"type": "trace", "trace": "synthetic.csv"})
    contexts = of(events, "context")
    assert len(contexts) == len(trace.events) and all(c["mode"] == "append" for c in contexts)
    assert [c["sources"][0]["title"] for c in contexts] == [e.source for e in trace.events]
    assert of(events, "retrieval_done")[0]["events"] == len(trace.events)
    assert of(events, "final")[0]["context_tokens"] == contexts[-1]["context_tokens"]


@pytest.mark.parametrize("name, reason", [("../synthetic.csv", "plain .csv"), ("missing.csv", "no trace")])
def test_bad_trace_names_are_400(setup, name, reason):
    r = httpx.post(f"{setup['base']}/v1/rag", timeout=60,
                   json={"question": "q", "source": {"type": "trace", "trace": name}})
    assert r.status_code == 400 and reason in r.json()["reason"], r.text


def test_chunk_over_the_context_limit_is_skipped_and_the_rest_answered(setup):
    huge = "word " * 5000  # > limits.max_context_tokens (3000)
    events = rag(setup["base"], "Which city?", {"type": "documents", "documents": [huge, "Lima is in Peru."]})
    skipped = of(events, "context_skipped")
    assert len(skipped) == 1 and "exceeds the limit" in skipped[0]["reason"]
    assert [s["source_id"] for s in of(events, "final")[0]["citations"]] == ["doc-1"]


def _counter(base, name) -> float:
    text = httpx.get(f"{base}/metrics", timeout=30).text
    lines = [ln for ln in text.splitlines() if ln.startswith(name + " ")]
    return float(lines[0].split()[-1]) if lines else 0.0


def test_retrieved_chunks_go_to_the_replica_and_never_through_the_ingress(setup):
    """One Ray hop per chunk (retriever actor -> replica); the ingress gets summaries, no text."""
    base = setup["base"]
    before = {n: _counter(base, n) for n in ("stream2llm_ingress_chunk_bytes_total",
                                             "stream2llm_replica_context_chunks_total")}
    events = rag(base, "Summarize.", {"type": "trace", "trace": "synthetic.csv"})
    contexts = of(events, "context")
    assert contexts and all("text" not in c for c in contexts)
    assert _counter(base, "stream2llm_ingress_chunk_bytes_total") == before["stream2llm_ingress_chunk_bytes_total"]
    assert (_counter(base, "stream2llm_replica_context_chunks_total")
            == before["stream2llm_replica_context_chunks_total"] + len(contexts))
    rag(base, "Which city?", {"type": "documents", "documents": ["Lima is in Peru."]})  # inline: counted
    assert _counter(base, "stream2llm_ingress_chunk_bytes_total") > before["stream2llm_ingress_chunk_bytes_total"]
