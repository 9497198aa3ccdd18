"""The claims table at the top of docs/BENCHMARKS.md (`bench.claims`): every claim reads a committed
results file, a verdict follows the figure against its target, and the table goes stale when a
figure in the JSON changes."""

import json
import shutil

import pytest

from bench import claims
from bench.claims import CLAIMS, Claim, Target, at
from bench.render_docs import RESULTS, render_text, stale_blocks

BLOCK = "<!-- results:claims -->\n<!-- /results:claims -->\n"


def test_every_claim_reads_a_committed_file_and_gives_a_verdict():
    rendered = render_text(BLOCK)
    for claim in CLAIMS:
        data = json.loads((RESULTS / claim.results).read_text(encoding="utf-8"))
        assert claim.figure(data) is not None, claim.text
        assert claim.text in rendered
    rows = [line for line in rendered.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == len(CLAIMS)
    assert all(any(v in row for v in ("| met |", "| **missed** |", "| no target |")) for row in rows)


def test_a_figure_past_its_target_turns_the_row_to_missed_and_the_block_stale(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(RESULTS, results)
    committed = render_text(BLOCK, results)
    data = json.loads((results / "engine_load.json").read_text())
    data["summary"]["light_load_speedup_p50"] = 2.5  # below its target (>= 3)
    (results / "engine_load.json").write_text(json.dumps(data))
    assert stale_blocks(committed, results) == ["claims"]
    row = next(line for line in render_text(BLOCK, results).splitlines() if "lightest load" in line)
    assert "| 2.5 | >= 3 | **missed** |" in row


def test_targets_read_their_bound_from_the_file_and_refuse_unknown_operators():
    claim = Claim("x", "f.json", at("a", "b"), Target("<=", at("limit")), lambda d: "1 run")
    assert claim.target.met(claim.figure({"a": {"b": 4}, "limit": 5}), {"limit": 5})
    assert not claim.target.met(6, {"limit": 5}) and claim.target.met(None, {}) is None
    with pytest.raises(ValueError, match="operator"):
        Target("=<", 1)


def test_machine_names_cpu_bf16_and_dtype_where_recorded():
    meta = {"meta": {"machine": {"cpu_model": "AMD EPYC", "cpu_bf16": False}, "dtype": "float32"}}
    assert claims.machine(meta) == "AMD EPYC (no bf16), float32"
    assert claims.machine({"meta": {"machine": {}, "dtype": None}}) == "CPU not recorded"


def test_a_claimed_file_without_a_table_of_its_own_gets_its_provenance_in_the_claims_block():
    from bench.render_docs import REGISTRY, render_block

    shown = {file for name, entry in REGISTRY.items() if name != "claims" for file in entry.files}
    alone = [file for file in claims.files() if file not in shown]
    assert alone, "test premise: some claimed file has no block of its own"
    block = render_block("claims")
    for file in claims.files():
        assert (f"- Results: `bench/results/{file}`; commit" in block) == (file in alone)
