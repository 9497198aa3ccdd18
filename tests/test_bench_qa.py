"""`bench.qa` end to end on the tiny model: two grounded questions, both prompt modes, real Ray/Serve/FAISS.

The tiny model answers gibberish, so accuracy is not asserted; what is: the report's keys, that
`identical_answers` counts the equal (stream, oneshot) pairs, and that in float32 both modes give
the same greedy answer from the same prompt tokens (the tiny model is deterministic).
"""

import json

import pytest

from bench.qa import main
from retrievers.corpus import GroundedQuestion

pytestmark = pytest.mark.timeout(400)


def test_matching_is_case_and_accent_insensitive():
    brazil, moldova = GroundedQuestion("Brazil", "Brasília", "Brazil"), GroundedQuestion("Moldova", "Chișinău", "Moldova")
    assert moldova.answered_by("It is CHISINAU.")
    assert brazil.answered_by("The capital is Brasilia.")
    assert not brazil.answered_by("The capital is Brasilia.", accent_sensitive=True)
    assert brazil.answered_by("the capital is brasília", accent_sensitive=True)
    assert not brazil.answered_by("Rio de Janeiro")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    from retrievers.embedding import Embedder
    from retrievers.vector_index import IndexSpec, build_index

    root = tmp_path_factory.mktemp("qa")
    index = build_index(IndexSpec(subset_others=10, grounded_limit=2, nlist=4), root / "index", Embedder(),
                        progress=False)
    out = root / "qa.json"
    main(["--model", "tiny", "--dtype", "float32", "--questions", "2", "--max-tokens", "8",
          "--index", str(index.path), "--out", str(out), "--no-progress"])
    return json.loads(out.read_text())


def test_report_has_the_issue_keys_and_consistent_counts(report):
    for key in ("accuracy", "accuracy_stream", "accuracy_nonstream", "identical_answers", "identical_fraction",
                "differing", "rows", "setup"):
        assert key in report
    assert report["questions"] == 2 and report["errors"] == 0 and report["answered_both"] == 2
    for mode in ("stream", "nonstream"):
        assert report[mode]["ttft_p50_s"] is not None and report[mode]["ttft_p50_s"] >= 0
    rows = report["rows"]
    assert all(r["stream"] and r["oneshot"] for r in rows)  # 8 greedy tokens each
    equal = sum(r["stream"] == r["oneshot"] for r in rows)
    assert report["identical_answers"] == equal
    assert len(report["differing"]) == 2 - equal
    assert report["accuracy_stream"] == sum(r["stream_correct"] for r in rows) / 2


def test_float32_stream_and_oneshot_agree_on_prompt_and_answer(report):
    rows = report["rows"]
    assert all(r["stream_citations"] == r["oneshot_citations"] for r in rows)
    # a streamed session's context_tokens stops before the question, a one-shot prompt's includes it
    assert all(r["oneshot_context_tokens"] > r["stream_context_tokens"] > 0 for r in rows), rows
    assert report["same_prompt_length"] == 2 and all(r["same_prompt_length"] for r in rows), rows
    assert report["identical_answers"] == 2, report["differing"]
