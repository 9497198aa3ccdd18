"""`python -m bench.cluster_sim --quick`: the results file's keys, and the headline key's verdict
follows its figure (it can fail)."""

import json

import pytest

from bench import claims, cluster_sim
from bench.doc_tables_cluster import cluster_sim as render


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("cluster") / "cluster_sim.json"
    assert cluster_sim.main(["--quick", "--output", str(out)]) == 0
    return json.loads(out.read_text())


def test_the_quick_grid_writes_every_key_per_router(quick):
    assert quick["headline_replicas"] == 64
    ratio = quick["central_vs_pow2_p99_ratio_64_at_80"]
    assert ratio > 0 and quick["met"] == (ratio <= 0.5)
    assert ("why_missed" in quick) == (not quick["met"])
    for cell in quick["cells"].values():
        assert set(cell["routers"]) == set(cluster_sim.ROUTERS)
        for r in cell["routers"].values():
            assert r["ttft_p50_s"] <= r["ttft_p99_s"]
            assert 0 <= r["goodput_frac"] <= 1 and r["preemptions"] >= 0 and r["sessions"] == cell["sessions"]
    assert "central / pow2 P99" in render(quick)


def _cells(central_p99: float) -> dict:
    def routers(c):
        return {"central": {"ttft_p99_s": c}, "pow2": {"ttft_p99_s": 1.0}}
    return {"64/mixed/poisson/0.8": {"replicas": 64, "load": 0.8, "routers": routers(central_p99)},
            "64/mixed/poisson/0.6": {"replicas": 64, "load": 0.6, "routers": routers(9.0)}}


@pytest.mark.parametrize("central_p99, met", [(0.4, True), (0.5, True), (0.6, False)])
def test_the_headline_ratio_meets_or_misses_its_target(central_p99, met):
    cells = _cells(central_p99)
    for c in cells.values():
        c["routers"]["central"].update(queued_frac=0.0, queue_wait_p99_s=0.0, preemptions=0,
                                       most_placed_between_reports=1)
    report = cluster_sim.summarize(cells, (8, 64))
    assert report["central_vs_pow2_p99_ratio_64_at_80"] == pytest.approx(central_p99)
    assert report["met"] is met and ("why_missed" in report) == (not met)
    claim = next(c for c in claims.CLAIMS if c.results == "cluster_sim.json" and "64" in c.text)
    data = {**report, claims.META_KEY: {}}
    assert claim.target.met(claim.figure(data), data) is met


def test_without_64_replicas_there_is_no_headline_verdict():
    cells = {k.replace("64", "16"): {**c, "replicas": 16} for k, c in _cells(0.1).items()}
    report = cluster_sim.summarize(cells, (8, 16))
    assert report["central_vs_pow2_p99_ratio_64_at_80"] is None and report["met"] is None
