"""`bench.ingress_costs`: counters read from /metrics text and turned into per-session figures."""

import pytest
from prometheus_client import generate_latest

from bench.ingress_costs import per_session, read_counters
from pipeline.ingress.metrics import PipelineMetrics


def test_the_ingress_registry_exposes_every_counter_read():
    metrics = PipelineMetrics()
    metrics.ingress_chunk_bytes.inc(120)
    metrics.replica_chunks.inc(3)
    values = read_counters(generate_latest(metrics.registry).decode())
    assert values["ingress_chunk_bytes"] == 120 and values["replica_pulled_chunks"] == 3
    assert values["ingress_cpu_s"] > 0  # this process's CPU time so far


def test_missing_counters_are_an_error():
    with pytest.raises(ValueError, match="stream2llm_ingress_process_cpu_seconds_total"):
        read_counters("stream2llm_ingress_chunk_bytes_total 0.0\nstream2llm_replica_context_chunks_total 0.0\n")


def test_hops_per_piece_count_pulled_pieces_once_and_others_twice():
    before = {"ingress_cpu_s": 1.0, "ingress_chunk_bytes": 0.0, "replica_pulled_chunks": 10.0}
    requests = [{"contexts": 3}, {"contexts": 5}]
    streamed = per_session(before, {**before, "ingress_cpu_s": 1.5, "replica_pulled_chunks": 18.0}, requests)
    assert streamed["ray_hops_per_chunk"] == 1.0 and streamed["ingress_cpu_s_per_session"] == 0.25
    buffered = per_session(before, {**before, "ingress_chunk_bytes": 800.0}, requests)
    assert buffered["ray_hops_per_chunk"] == 2.0 and buffered["ingress_chunk_bytes_per_session"] == 400.0
    half = per_session(before, {**before, "replica_pulled_chunks": 14.0}, requests)
    assert half["ray_hops_per_chunk"] == 1.5
    assert per_session(before, before, [])["ray_hops_per_chunk"] is None
