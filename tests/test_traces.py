"""Shared trace model: synthetic shapes, stretching, LCP, CSV round trips, bad input."""

import numpy as np
import pytest

from stream2llm.data.traces import (
    QueryTrace,
    TraceEvent,
    TraceFormatError,
    lcp_tokens,
    poisson_arrivals,
    read_crawler_csv,
    read_vector_csv,
    synthetic_crawler_traces,
    synthetic_vector_traces,
    write_crawler_csv,
    write_vector_csv,
)


def _gaps(traces):
    return [b.end_s - a.end_s for t in traces for a, b in zip(t.events, t.events[1:])]


def test_crawler_shape_matches_paper_statistics():
    traces = synthetic_crawler_traces(1500, seed=3)
    gaps = _gaps(traces)
    assert 7.4 < np.mean([len(t.events) for t in traces]) < 8.4
    assert 0.6 < np.median(gaps) < 0.8 and 0.9 < np.mean(gaps) < 1.2
    assert 8000 < np.mean([t.total_context_tokens() for t in traces]) < 9800
    assert 8.3 < np.mean([t.duration_s for t in traces]) < 10.1
    assert all(e.kind == "append" for t in traces for e in t.events)
    assert traces[0].events[0].source == "tavily_search"


def test_vector_shape_matches_paper_statistics_and_changes_only_tails():
    traces = synthetic_vector_traces(1500, seed=3)
    gaps = _gaps(traces)
    assert 4.0 < np.mean([len(t.events) for t in traces]) < 4.8
    assert 0.02 < np.median(gaps) < 0.06
    assert 2500 < np.mean([t.total_context_tokens() for t in traces]) < 3300
    assert 11500 < np.mean([sum(e.num_tokens for e in t.events) for t in traces]) < 14500
    assert 3.8 < np.mean([t.duration_s for t in traces]) < 5.2
    for t in traces[:200]:
        for a, b in zip(t.events, t.events[1:]):
            kept = lcp_tokens(a.doc_ids, b.doc_ids, t.doc_tokens)
            assert kept >= sum(t.doc_tokens[d] for d in a.doc_ids[: len(a.doc_ids) // 2])


def test_generators_are_deterministic_and_scale_tokens():
    assert synthetic_crawler_traces(5, seed=1) == synthetic_crawler_traces(5, seed=1)
    assert synthetic_crawler_traces(5, seed=1) != synthetic_crawler_traces(5, seed=2)
    full = synthetic_vector_traces(20, seed=1)
    small = synthetic_vector_traces(20, seed=1, tokens_scale=0.1)
    ratio = sum(t.total_context_tokens() for t in small) / sum(t.total_context_tokens() for t in full)
    assert 0.08 < ratio < 0.12


def test_unknown_shape_parameter_is_rejected_with_valid_names():
    with pytest.raises(TraceFormatError, match="tokens_scale"):
        synthetic_crawler_traces(2, seed=0, token_scale=0.5)


def test_stretched_scales_times_not_tokens():
    trace = synthetic_crawler_traces(1, seed=0)[0]
    longer = trace.stretched(10.0)
    assert longer.duration_s == pytest.approx(trace.duration_s * 10)
    assert [e.num_tokens for e in longer.events] == [e.num_tokens for e in trace.events]
    with pytest.raises(TraceFormatError):
        trace.stretched(0)


def test_lcp_tokens_stops_at_first_difference():
    tokens = {"a": 10, "b": 20, "c": 30, "d": 5}
    assert lcp_tokens(["a", "b", "c"], ["a", "b", "d"], tokens) == 30
    assert lcp_tokens(["a", "b"], ["b", "a"], tokens) == 0
    assert lcp_tokens(["a"], ["a", "b"], tokens) == 10


def test_poisson_arrivals_rate_and_seed():
    times = poisson_arrivals(4000, qps=4.0, seed=7)
    assert times[0] == 0.0 and times == sorted(times)
    assert 4000 / times[-1] == pytest.approx(4.0, rel=0.06)
    assert times == poisson_arrivals(4000, qps=4.0, seed=7)
    with pytest.raises(TraceFormatError):
        poisson_arrivals(3, qps=0, seed=0)


def test_trace_validation():
    event = TraceEvent(0.0, 1.0, "append", 5)
    with pytest.raises(TraceFormatError):
        QueryTrace("q", "crawler", "x", (), 3, 4)
    with pytest.raises(TraceFormatError):
        QueryTrace("q", "crawler", "x", (event, TraceEvent(0.0, 0.5, "append", 5)), 3, 4)


def test_crawler_csv_round_trip(tmp_path):
    traces = synthetic_crawler_traces(3, seed=5)
    path = tmp_path / "crawler.csv"
    write_crawler_csv(traces, path)
    back = read_crawler_csv(path, question_tokens=traces[0].question_tokens)
    assert [t.query for t in back] == [t.query for t in traces]
    for a, b in zip(traces, back):
        assert [(e.end_s, e.num_tokens, e.source) for e in a.events] == [
            (e.end_s, e.num_tokens, e.source) for e in b.events]
        assert a.total_context_tokens() == b.total_context_tokens()


def test_crawler_csv_in_paper_format_counts_tokens_from_content(tmp_path):
    path = tmp_path / "paper.csv"
    path.write_text("type,query,content,startTime,endTime\n"
                    "page_scrape,q1,one two three four,0.5,1.5\n"
                    "tavily_search,q1,alpha beta,0.0,0.4\n")
    (trace,) = read_crawler_csv(path, count_tokens=lambda text: len(text.split()))
    assert [e.source for e in trace.events] == ["tavily_search", "page_scrape"]
    assert [e.num_tokens for e in trace.events] == [2, 4]


def test_vector_csv_round_trip_keeps_lcp(tmp_path):
    traces = synthetic_vector_traces(3, seed=5)
    path = tmp_path / "vector.csv"
    write_vector_csv(traces, path)
    doc_tokens = {d: n for t in traces for d, n in t.doc_tokens.items()}
    back = read_vector_csv(path, doc_tokens=doc_tokens, question_tokens=traces[0].question_tokens)
    assert len(back) == 3
    for a, b in zip(traces, back):
        assert [e.doc_ids for e in a.events] == [e.doc_ids for e in b.events]
        assert [e.num_tokens for e in a.events] == [e.num_tokens for e in b.events]
        assert [e.end_s for e in b.events] == pytest.approx([e.end_s for e in a.events], abs=1e-6)


def test_vector_csv_paper_format_with_python_list(tmp_path):
    path = tmp_path / "q7.csv"
    path.write_text("StartTime_us,EndTime_us,PipelinePool\n"
                    "0,100000,\"['a', 'b']\"\n100000,137000,\"['a', 'c']\"\n")
    (trace,) = read_vector_csv(path, doc_tokens={"a": 100}, default_doc_tokens=7, question_tokens=3)
    assert trace.query == "q7"
    assert [e.num_tokens for e in trace.events] == [110, 110]
    assert lcp_tokens(trace.events[0].doc_ids, trace.events[1].doc_ids, trace.doc_tokens) == 100


def test_bad_csv_is_rejected(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("type,query,startTime\nx,y,1\n")
    with pytest.raises(TraceFormatError, match="missing columns"):
        read_crawler_csv(path)
    path.write_text("StartTime_us,EndTime_us,PipelinePool\n0,1,not a list\n")
    with pytest.raises(TraceFormatError, match="PipelinePool"):
        read_vector_csv(path)
