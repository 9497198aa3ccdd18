"""`bench.soak` in short: locust drives the mixed workload (streamed RAG, streaming-input sessions
with disconnects, OpenAI chat) against the real local app (tiny model) for 25 s; afterwards every
request kind was exercised, none failed, and the cluster drained to its idle KV level."""

import json

import pytest

from bench.soak import main

pytestmark = pytest.mark.timeout(600)


def test_short_soak_serves_every_kind_and_drains(tmp_path):
    out = tmp_path / "soak.json"
    report = main(["--users", "6", "--spawn-rate", "3", "--duration", "25", "--session-ttl", "10",
                   "--disconnect", "0.4", "--out", str(out)])
    assert json.loads(out.read_text())["meta"]["commit"]
    assert report["locust_exit_code"] == 0
    names = set(report["by_request"])
    assert {"rag (streamed)", "streams: open", "streams: append"} <= names
    assert names & {"chat", "chat (streamed)"} and names & {"streams: finish", "streams: finish (disconnects)"}
    assert report["requests"] >= 20 and report["failures"] == 0, report["failures_by_kind"]
    assert report["drained"] and not report["leaks"], report["end"]
