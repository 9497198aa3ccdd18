"""`bench.serving_metrics` and `bench.results_meta`: vLLM-named serving metrics and run metadata (pure)."""

import json

import pytest

from bench.results_meta import REQUIRED, legacy_meta, missing_metadata, start_run, write_results
from bench.serving_metrics import (MetricsError, RequestRecord, record_from_summary, serving_metrics,
                                   summary_stats)


def _records():
    return [
        # 0.5 s TTFT, 11 tokens over 1 s after the first: TPOT 100 ms; token events 0.5 s apart
        RequestRecord(sent_s=0.0, first_token_s=0.5, end_s=1.5, output_tokens=11, token_times=(0.5, 1.0, 1.5)),
        # TTFT measured from retrieval done (2.0), not from the send (1.0): 200 ms
        RequestRecord(sent_s=1.0, first_token_s=2.2, end_s=2.6, output_tokens=5, ttft_start_s=2.0),
        RequestRecord(sent_s=2.0, ok=False),
    ]


def test_vllm_named_keys_and_values():
    m = serving_metrics(_records(), duration_s=4.0, slo_ttft_ms=300)
    for metric in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "std", "p50", "p95", "p99"):
            assert f"{stat}_{metric}_ms" in m
    assert m["completed"] == 2 and m["failed"] == 1 and m["total_output_tokens"] == 16
    assert m["request_throughput"] == pytest.approx(0.5)
    assert m["output_throughput"] == pytest.approx(4.0)
    assert m["mean_ttft_ms"] == pytest.approx(350)  # (500 + 200) / 2
    assert m["median_tpot_ms"] == pytest.approx((100 + 100) / 2)  # 1000/10 and 400/4
    assert m["mean_itl_ms"] == pytest.approx(500) and m["itl_measured"]
    assert m["p99_e2el_ms"] == pytest.approx(1599)  # e2el 1500 and 1600 ms, linear interpolation
    # only the second request meets a 300 ms TTFT SLO: 1 good request in 4 s
    assert m["request_goodput"] == pytest.approx(0.25)
    assert m["goodput_slos_ms"] == {"ttft": 300}


def test_no_slo_no_goodput_and_no_token_times_no_itl():
    records = [RequestRecord(sent_s=0.0, first_token_s=0.1, end_s=0.2, output_tokens=2)]
    m = serving_metrics(records, duration_s=1.0)
    assert m["request_goodput"] is None
    assert m["mean_itl_ms"] is None and m["p99_itl_ms"] is None and not m["itl_measured"]


def test_every_slo_must_hold_for_goodput():
    r = RequestRecord(sent_s=0.0, first_token_s=0.1, end_s=2.1, output_tokens=3)  # TPOT 1000 ms
    assert serving_metrics([r], 1.0, slo_ttft_ms=200)["request_goodput"] == 1.0
    assert serving_metrics([r], 1.0, slo_ttft_ms=200, slos_ms={"tpot": 500})["request_goodput"] == 0.0
    missing_ttft = RequestRecord(sent_s=0.0, end_s=1.0, output_tokens=0)
    assert serving_metrics([missing_ttft], 1.0, slo_ttft_ms=10_000)["request_goodput"] == 0.0


@pytest.mark.parametrize("kwargs", [dict(duration_s=0), dict(duration_s=1, slo_ttft_ms=-5),
                                    dict(duration_s=1, slos_ms={"latency": 5})])
def test_bad_parameters_raise(kwargs):
    with pytest.raises(MetricsError):
        serving_metrics(_records(), **kwargs)


def test_empty_stats_are_none_and_percentiles_configurable():
    assert summary_stats("ttft", [])["median_ttft_ms"] is None
    stats = summary_stats("ttft", [1.0, 2.0, 3.0, 4.0], percentiles=(90,))
    assert stats["p90_ttft_ms"] == pytest.approx(3.7) and "p99_ttft_ms" not in stats


def test_record_from_relative_summary():
    r = record_from_summary({"sent_s": 10.0, "latency_s": 2.0, "first_token_s": 1.5, "retrieval_done_s": 1.0,
                             "token_times_s": [1.5, 1.7], "output_tokens": 4, "ok": True})
    assert r.ttft_ms() == pytest.approx(500) and r.e2el_ms() == pytest.approx(2000)
    assert r.itl_ms() == pytest.approx([200]) and r.tpot_ms() == pytest.approx(500 / 3)


def test_results_file_carries_the_required_metadata(tmp_path):
    meta = start_run(model="tiny", dtype="float32", seeds=[0, 1], command="python -m bench.x")
    path = write_results(tmp_path / "x.json", {"figure": 1.5}, meta)
    data = json.loads(path.read_text())
    assert list(data)[0] == "meta" and data["figure"] == 1.5
    assert missing_metadata(data) == []
    m = data["meta"]
    assert m["machine"]["cores"] >= 1 and len(m["machine"]["load_avg_before"]) == 3
    assert m["seeds"] == [0, 1] and m["command"] == "python -m bench.x" and m["date_utc"].endswith("+00:00")


def test_legacy_metadata_declares_what_is_missing():
    meta = legacy_meta({"model": "smollm2", "dtype": "bfloat16"}, "measured before metadata was recorded")
    assert set(meta["missing"]) == {"commit", "date_utc", "machine", "seeds"}
    assert missing_metadata({"meta": meta}) == meta["missing"]
    assert missing_metadata({}) == list(REQUIRED)


def test_record_from_a_rag_result():
    from bench.serving_metrics import record_from_rag
    from pipeline.run.rag_client import RagResult

    r = RagResult("q?", "stream", status=200, final={"output_tokens": 3}, sent_at=1.0, retrieval_done_at=2.0,
                  first_token_at=2.25, done_at=2.75, token_times=[2.25, 2.5, 2.75])
    rec = record_from_rag(r)
    assert rec.ok and rec.ttft_ms() == pytest.approx(250) and rec.e2el_ms() == pytest.approx(1750)
    assert rec.itl_ms() == pytest.approx([250, 250]) and rec.tpot_ms() == pytest.approx(250)
