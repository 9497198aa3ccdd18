"""The HTTP replay benchmark: `python -m bench.cli` end to end on the tiny model (real Ray, Serve and
HTTP on loopback), plus unit tests of its statistics, trace files and argument checks."""

import argparse
import csv
import json
import math

import pytest

from bench import cli
from bench.http_replay import (BenchError, BenchSpec, aggregate, ccdf, cluster_sample, load_traces,
                               write_request_traces)
from scheduler.policies import UnknownPolicyError
from stream2llm.data.traces import PromptMode

REQUESTS = 4


def _args(*argv: str):
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    args = _args("--model", "tiny", "--kv-cache-bytes", str(16 << 20), "--requests", str(REQUESTS),
                 "--qps", "4", "--policies", "fcfs", "--multiplier", "0.2", "--out", str(out))
    code = cli.run(args)
    return code, out, json.loads((out / "results.json").read_text())


@pytest.mark.timeout(300)
def test_every_offered_request_is_accounted_for(bench_run):
    code, _, result = bench_run
    assert code == 0
    assert [(c["mode"], c["qps"]) for c in result["cells"]] == [("stream", 4.0), ("oneshot", 4.0)]
    for cell in result["cells"]:
        assert cell["sessions"] == REQUESTS
        assert cell["answered"] + cell["rejected"] + cell["failed"] == REQUESTS
        assert cell["failed"] == 0 and cell["answered"] >= 1
        assert cell["series"], "the cluster was never sampled"
        assert all(s["replicas"] == 1 and s["kv_blocks_total"] > 0 for s in cell["series"])
    assert len(result["requests"]) == 2 * REQUESTS


@pytest.mark.timeout(300)
def test_cell_figures_are_ordered_and_finite(bench_run):
    _, _, result = bench_run
    for cell in result["cells"]:
        assert 0 < cell["ttft_p50_s"] <= cell["ttft_p95_s"] <= cell["ttft_p99_s"]
        assert math.isfinite(cell["pipeline_overhead_p50_s"]) and cell["engine_ttft_p50_s"] > 0
        assert cell["makespan_s"] >= max(r["latency_s"] for r in result["requests"] if r["mode"] == cell["mode"])
    streamed = [r for r in result["requests"] if r["mode"] == "stream" and r["ok"]]
    assert all(r["tokens_prefilled_before_finish"] > 0 for r in streamed), "stream mode prefilled nothing early"


@pytest.mark.timeout(300)
def test_output_files_exist(bench_run):
    _, out, result = bench_run
    for name in ("results.json", "requests.csv", "ttft_ccdf.png", "kv_sessions.png"):
        assert (out / name).stat().st_size > 0, name
    with (out / "requests.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(result["requests"]) and {r["mode"] for r in rows} == {"stream", "oneshot"}


# ---- pure parts ---------------------------------------------------------------------------------
def _request(ok=True, status=200, ttft=0.5, engine=0.4, sent=0.0, latency=1.0):
    return {"ok": ok, "status": status, "ttft_s": ttft, "engine_ttft_s": engine, "sent_s": sent,
            "latency_s": latency}


def test_aggregate_counts_percentiles_overhead_and_makespan():
    requests = [_request(ttft=t, engine=t - 0.01, sent=i, latency=2.0) for i, t in enumerate((0.1, 0.2, 0.3, 0.4))]
    requests += [_request(ok=False, status=429, ttft=None, engine=None, latency=0.01),
                 _request(ok=False, status=200, ttft=None, engine=None, sent=1.0, latency=None)]
    agg = aggregate(requests)
    assert (agg["sessions"], agg["answered"], agg["rejected"], agg["failed"]) == (6, 4, 1, 1)
    assert agg["ttft_p50_s"] == pytest.approx(0.25)
    assert agg["ttft_p50_s"] <= agg["ttft_p95_s"] <= agg["ttft_p99_s"] <= 0.4
    assert agg["pipeline_overhead_p50_s"] == pytest.approx(0.01)
    assert agg["makespan_s"] == pytest.approx(5.0)  # first send at 0, last done at 3 + 2


def test_aggregate_of_nothing_answered():
    agg = aggregate([_request(ok=False, status=429, ttft=None, engine=None)])
    assert agg["rejected"] == 1 and agg["ttft_p50_s"] is None and agg["pipeline_overhead_p50_s"] is None


def test_ccdf_starts_at_one_and_ends_at_one_over_n():
    xs, ys = ccdf([3.0, None, 1.0, 2.0, 2.0])
    assert xs == [1.0, 2.0, 2.0, 3.0]
    assert ys == [1.0, 0.75, 0.5, 0.25]
    assert ccdf([]) == ([], [])


def test_cluster_sample_sums_replica_reports():
    view = {"pressure": {"replicas": 2, "kv_blocks_used": 30, "kv_blocks_total": 100, "sessions": 5, "queued": 1},
            "replicas": {"a": {"sessions_active": 2, "sessions_idle": 1, "preemptions": 3},
                         "b": {"sessions_active": 1, "sessions_idle": 1, "preemptions": 0}}}
    s = cluster_sample(view, 1.23456)
    assert (s["t_s"], s["replicas"], s["active"], s["idle"], s["preemptions"]) == (1.235, 2, 3, 2, 3)


def test_request_traces_are_replayable_and_distinct_per_cell(tmp_path):
    from pipeline.ingress.retriever_actors import load_trace

    spec = BenchSpec(workload="vector", requests=2, shape={"top_k": 3})
    traces = load_traces(spec)
    a = write_request_traces(traces, tmp_path, "cellA")
    b = write_request_traces(traces, tmp_path, "cellB")
    assert [q for _, q in a] == [t.query for t in traces]
    first_a, first_b = load_trace(tmp_path, a[0][0]), load_trace(tmp_path, b[0][0])
    assert len(first_a.events) == len(traces[0].events)
    assert set(first_a.events[0].doc_ids).isdisjoint(first_b.events[0].doc_ids)


def test_csv_workload_is_cycled_to_the_request_count(tmp_path):
    from stream2llm.data.traces import synthetic_crawler_traces, write_crawler_csv

    path = tmp_path / "paper.csv"
    write_crawler_csv(synthetic_crawler_traces(2, seed=1), path)
    traces = load_traces(BenchSpec(workload=str(path), requests=5))
    assert [t.query for t in traces] == [traces[0].query, traces[1].query] * 2 + [traces[0].query]


@pytest.mark.parametrize("argv, error, words", [
    (("--policies", "fcfs,nope"), UnknownPolicyError, "valid: "),
    (("--modes", "stream,batch"), BenchError, "valid: stream, oneshot"),
    (("--workload", "/no/such.csv"), BenchError, "trace CSV path"),
    (("--qps", "1,x"), BenchError, "numbers"),
    (("--qps", "0"), BenchError, "> 0"),
    (("--shape", "pages=3"), ValueError, "unknown shape parameters"),
])
def test_bad_arguments_are_refused_before_any_app_starts(argv, error, words):
    with pytest.raises(error, match=words):
        cli.spec_from_args(_args(*argv)).validate()
    assert cli.run(_args(*argv)) == 2


def test_arguments_build_the_app_sections():
    spec = cli.spec_from_args(_args("--replicas", "1", "--max-replicas", "3", "--kv-cache-bytes", "1024",
                                    "--step-tokens", "512", "--shape", "page_tokens=100", "--qps", "0.5,1"))
    assert spec.app["replicas"]["max_replicas"] == 3 and spec.app["model"]["kv_cache_memory_bytes"] == 1024
    assert spec.app["model"]["max_num_batched_tokens"] == 512
    assert spec.shape["page_tokens"] == 100 and spec.qps == (0.5, 1.0)


def test_aggregate_reports_e2e_throughput_and_serving_metrics():
    requests = [{**_request(sent=i, latency=2.0), "first_token_s": 1.0, "retrieval_done_s": 0.5,
                 "token_times_s": [1.0, 1.5], "output_tokens": 2} for i in range(3)]
    agg = aggregate(requests, slos_ms={"ttft": 600})
    assert agg["e2e_p50_s"] == pytest.approx(2.0) and agg["sessions_per_s"] == pytest.approx(3 / 4.0)
    serving = agg["serving"]
    assert serving["completed"] == 3 and serving["median_ttft_ms"] == pytest.approx(500)
    assert serving["mean_itl_ms"] == pytest.approx(500) and serving["request_goodput"] == pytest.approx(0.75)


def _cell(mode, answered, makespan):
    return {"mode": mode, "clients": 4, "answered": answered, "sessions": answered, "failed": 0, "rejected": 0,
            "ttft_p50_s": 1.0, "ttft_p95_s": 2.0, "makespan_s": makespan, "sessions_per_s": answered / makespan,
            "e2e_p50_s": 5.0, "e2e_p99_s": 9.0, "ingress": {"ray_hops_per_chunk": 1.0 if mode == "stream" else 2.0}}


@pytest.mark.parametrize("stream_makespan, met", [(40.0, True), (50.0, False)])
def test_throughput_parity_can_fail(stream_makespan, met):
    from bench.pipeline import summarize

    result = {"cells": [_cell("stream", 12, stream_makespan), _cell("oneshot", 12, 40.0)], "requests": [],
              "wall_s": 1, "command": "x", "config": {}}
    summary = summarize(result)
    assert summary["throughput_ratio"] == pytest.approx(40.0 / stream_makespan)
    assert summary["throughput_parity_met"] is met and summary["load"] == "closed loop, 4 clients"
    assert summary["e2e_s"]["stream"] == {"p50": 5.0, "p99": 9.0}
    assert summary["ray_hops_per_chunk"] == 1.0  # the streamed cell's


@pytest.mark.timeout(400)
def test_closed_loop_pipeline_bench_end_to_end(tmp_path):
    from bench import pipeline

    out = tmp_path / "pipeline.json"
    code = pipeline.main(["--model", "tiny", "--kv-cache-bytes", str(16 << 20), "--quick", "--clients", "2",
                          "--multiplier", "0.2", "--step-tokens", "2048", "--slo-ttft", "60000",
                          "--output", str(out), "--out", str(tmp_path)])
    summary = json.loads(out.read_text())
    assert code == 0 and summary["failed"] == 0 and summary["meta"]["model"] == "tiny"
    # streamed: every retrieved piece went retriever -> replica; the one-shot baseline buffers in the ingress
    assert summary["ray_hops_per_chunk"] == 1.0 and summary["oneshot"]["ingress"]["ray_hops_per_chunk"] == 2.0
    assert summary["stream"]["ingress"]["ingress_chunk_bytes_per_session"] == 0
    for mode in PromptMode:
        cell = summary[mode]
        assert cell["clients"] == 2 and cell["answered"] == pipeline.QUICK_REQUESTS
        # a closed loop: at most `clients` sessions in flight, so no request waited for an arrival time
        assert all(r["arrival_s"] <= r["sent_s"] + 0.5 for r in summary["requests"])
        assert cell["serving"]["completed"] == pipeline.QUICK_REQUESTS
        assert cell["serving"]["request_goodput"] is not None and cell["serving"]["itl_measured"]
    assert summary["throughput_ratio"] > 0 and isinstance(summary["throughput_parity_met"], bool)
