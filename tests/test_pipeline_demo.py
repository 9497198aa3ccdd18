"""The main job end to end: `stream2llm demo` on the tiny model, one question, a small cached index.

Real Ray, real Serve, real HTTP, the real crawler on the local corpus site and the real FAISS
search; the tiny model answers gibberish, so answers are not checked for correctness here (the
SmolLM2 run is in the report), only that every request went through both sources and both modes.
"""

import json

import pytest

from pipeline.run import demo, demo_report
from stream2llm.data.traces import PromptMode

pytestmark = pytest.mark.timeout(600)

# Index spec: the first 20 grounded countries + 20 others, the same documents as the index of
# tests/test_pipeline_sources.py; built once into the cache, loaded on later runs.
ARGS = ["--model", "tiny", "--index-subset", "20", "--index-grounded", "20", "--questions", "1",
        "--crawler-pages", "3", "--site-latency-scale", "0.3", "--max-tokens", "8"]


def test_demo_answers_from_both_sources_in_both_modes_and_shuts_down(tmp_path, capsys):
    import ray

    out = tmp_path / "rows.json"
    assert demo.main(ARGS + ["--out", str(out)]) == 0
    rows = json.loads(out.read_text())
    question = demo.pick_questions(None, 1, 20)[0]
    assert [r["source"] for r in rows] == ["crawler", "vector"]
    assert all(r["country"] == question.country for r in rows)
    assert rows[0]["request_source"] == {"type": "search", "query": question.country}
    for row in rows:
        for mode in demo.MODES:
            result = row[mode]
            assert result["ok"] and result["prompt_mode"] == mode, result
            assert result["ttft_s"] > 0 and result["engine_ttft_s"] > 0
            assert result["answer"] and result["citations"]
        assert row["ttft_stream_s"] == row["stream"]["ttft_s"] and row["speedup"] > 0
        assert row["context_tokens"] > 0 and row["citations"]
        assert row["country_page_cited"], row["citations"]  # the crawler fetched the country's page
    crawled = [c["url_or_doc_id"] for c in rows[0]["citations"]]
    assert any(u.endswith(f"/wiki/{question.doc_id}") for u in crawled), crawled
    assert not ray.is_initialized()  # Ray and Serve were torn down
    printed = capsys.readouterr().out
    assert "TTFT stream" in printed and question.question in printed
    assert "PromptMode" not in printed  # no Python repr reaches the user


def test_unknown_country_is_a_clear_error_before_anything_starts(capsys):
    import ray

    assert demo.main(["--countries", "Atlantis"]) == 2
    printed = capsys.readouterr().out
    assert "no grounded question for Atlantis; e.g. " in printed and "[" not in printed
    assert not ray.is_initialized()


def test_questions_follow_the_chosen_countries():
    picked = demo.pick_questions(["japan", "Peru"], None, None)
    assert [(q.country, q.capital) for q in picked] == [("Japan", "Tokyo"), ("Peru", "Lima")]
    assert len(demo.pick_questions(None, None, None)) == 4
    assert [q.country for q in demo.pick_questions(["Japan", "Peru"], 1, None)] == ["Japan"]


@pytest.mark.parametrize("option, value", [("--questions", "0"), ("--max-tokens", "0"), ("--index-subset", "-1")])
def test_bad_option_values_are_refused_up_front(option, value, capsys):
    assert demo.main([option, value]) == 2
    assert f"{option} must be at least" in capsys.readouterr().out


def test_an_answer_block_shows_no_python_repr(capsys):
    failed = {"ok": False, "status": 503, "error": "EngineUnavailable: no replica", "answer": "",
              "ttft_s": None, "engine_ttft_s": None, "retrieval_s": None, "context_tokens": None}
    answered = {**failed, "ok": True, "status": 200, "error": None, "answer": "Paris, it's 'the' capital",
                "ttft_s": 0.5, "engine_ttft_s": 0.4, "retrieval_s": 1.25, "context_tokens": 700}
    row = {"question": "What is the capital of France?", "source": "crawler", "country": "France",
           "request_source": {"type": "search", "query": "France"}, "country_page_cited": False,
           "citations": [{"source_id": "s1", "title": "France"}],
           "source_errors": {PromptMode.STREAM: 2, PromptMode.ONESHOT: 0},
           PromptMode.STREAM: answered, PromptMode.ONESHOT: failed}
    demo_report.print_answer(1, row)
    printed = capsys.readouterr().out
    assert "PromptMode" not in printed and "None" not in printed and "{<" not in printed
    assert '"Paris, it\'s \'the\' capital"' in printed  # the answer as said, not its escaped repr
    assert "pages not fetched (source errors): 2 in the stream run" in printed
    assert "FAILED (503: EngineUnavailable: no replica)" in printed and "- context tokens" in printed
