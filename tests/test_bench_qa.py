"""`bench.qa` end to end on the tiny model, and the re-judging of a stored run.

End to end: one capital question from the vector and the crawler source, both prompt modes, real
Ray/Serve/FAISS and the local corpus site. The tiny model answers gibberish, so accuracy is not
asserted; what is: the report's keys and counts, that the strict judge scored every row, and that in
float32 the vector source's two modes give the same greedy answer from the same prompt (the tiny
model is deterministic).
"""

import json

import pytest

from bench.qa import main
from bench.qa_report import rejudge_legacy, summarize
from stream2llm.data.corpus import GroundedQuestion

pytestmark = pytest.mark.timeout(400)


def test_rejudge_a_stored_run_with_the_strict_judge():
    q = GroundedQuestion("Vatican City", "Vatican City", "Vatican_City")
    old = {"rows": [{"country": "Vatican City", "stream": "The capital of Vatican City is Rome.",
                     "oneshot": "The capital of Vatican City is Vatican City.", "stream_correct": True,
                     "oneshot_correct": True, "errors": [], "identical": False}]}
    rows = rejudge_legacy(old, {"Vatican City": q})
    assert rows[0]["stream_verdict"] == "other_candidate" and rows[0]["oneshot_correct"]
    vector = summarize(rows)["sources"]["vector"]
    assert vector["accuracy_stream"]["correct"] == 0 and vector["accuracy_oneshot"]["correct"] == 1
    assert vector["accuracy_oneshot"]["ci95"][0] < 1.0 == vector["accuracy_oneshot"]["rate"]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    from retrievers.embedding import Embedder
    from retrievers.vector_index import IndexSpec, build_index

    root = tmp_path_factory.mktemp("qa")
    index = build_index(IndexSpec(subset_others=10, grounded_limit=2, nlist=4), root / "index", Embedder(),
                        progress=False)
    out = root / "qa.json"
    main(["--model", "tiny", "--dtype", "float32", "--kinds", "capital", "--per-kind", "1", "--max-tokens", "8",
          "--crawler-pages", "3", "--site-latency-scale", "0.3", "--index", str(index.path), "--out", str(out),
          "--no-progress"])
    return json.loads(out.read_text())


def test_report_has_metadata_sources_and_consistent_counts(report):
    assert not [k for k in ("commit", "date_utc", "machine", "model", "dtype", "seeds") if report["meta"].get(k) is None]
    assert set(report["sources"]) == {"vector", "crawler"} and len(report["rows"]) == 2
    for name, s in report["sources"].items():
        assert s["questions"] == 1 and s["errors"] == 0, (name, s)
        for mode in ("stream", "oneshot"):
            acc = s[f"accuracy_{mode}"]
            assert acc["n"] == 1 and acc["correct"] in (0, 1) and len(acc["ci95"]) == 2
            assert sum(s["verdicts"][mode].values()) == 1
        assert s["identical_answers"] == sum(r["identical"] for r in report["rows"] if r["source"] == name)
    crawler = next(r for r in report["rows"] if r["source"] == "crawler")
    assert crawler["stream_citations"] and crawler["tokens_prefilled_before_finish"] is not None


def test_float32_vector_modes_agree_on_prompt_and_answer(report):
    row = next(r for r in report["rows"] if r["source"] == "vector")
    assert row["stream_citations"] == row["oneshot_citations"]
    # a streamed session's context_tokens stops before the question, a one-shot prompt's includes it
    assert row["oneshot_context_tokens"] > row["stream_context_tokens"] > 0, row
    assert row["identical"], row
