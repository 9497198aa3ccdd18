"""Docs generated from results: the committed tables of docs/BENCHMARKS.md and the README equal what
their results files render to, every results file under bench/results records (or declares missing)
its run metadata, and the check fails when a table and its JSON disagree."""

import json
import shutil

import pytest

from bench import render_docs
from bench.render_docs import DOCS, REGISTRY, RESULTS, RenderError, render_block, render_text, stale_blocks
from bench.results_meta import META_KEY


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_committed_docs_match_their_results(doc):
    text = doc.read_text(encoding="utf-8")
    assert render_docs.BLOCK.search(text), f"{doc.name} has no generated block"
    assert stale_blocks(text) == [], "run: python -m bench.render_docs"


def test_the_benchmarks_page_fits_one_reading():
    # the page a newcomer opens first: the claims table and the end-to-end tables, not a history;
    # components and their long tables go to BENCHMARKS_COMPONENTS.md
    lines = (RESULTS.parent.parent / "docs" / "BENCHMARKS.md").read_text(encoding="utf-8").count("\n")
    assert lines < 300, f"docs/BENCHMARKS.md has {lines} lines; move a component's section out or cut prose"


def test_every_registered_block_is_in_the_docs_and_renders():
    used = {m.group(2) for doc in DOCS for m in render_docs.BLOCK.finditer(doc.read_text(encoding="utf-8"))}
    assert used == set(REGISTRY)
    for name in REGISTRY:
        assert "Results: `bench/results/" in render_block(name)


def test_every_results_file_has_metadata_or_declares_it_missing():
    for path in RESULTS.rglob("*.json"):
        data = json.loads(path.read_text(encoding="utf-8"))
        meta = data.get(META_KEY)
        if meta is None:  # files of other benches written before metadata: the docs say so per table
            assert any(path.relative_to(RESULTS).as_posix() in e.files for e in REGISTRY.values()), path
            continue
        # model, dtype and seeds may be null for a bench that has none (a scheduler microbenchmark)
        assert "missing" in meta or (all(k in meta for k in ("model", "dtype", "seeds"))
                                     and all(meta.get(k) is not None for k in ("commit", "date_utc", "machine"))), path


def test_check_fails_when_a_table_and_its_json_disagree(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(RESULTS, results)
    doc = "<!-- results:reliability -->\n<!-- /results:reliability -->\n"
    rendered = render_text(doc, results)
    assert stale_blocks(rendered, results) == []
    data = json.loads((results / "reliability.json").read_text())
    data["counts"]["answered"] -= 1  # the JSON changes, the committed table does not
    (results / "reliability.json").write_text(json.dumps(data))
    assert stale_blocks(rendered, results) == ["reliability"]


def test_unknown_block_and_missing_file_are_errors(tmp_path):
    with pytest.raises(RenderError, match="no renderer"):
        render_text("<!-- results:nope -->\n<!-- /results:nope -->", tmp_path)
    with pytest.raises(RenderError, match="missing"):
        render_text("<!-- results:qa -->\n<!-- /results:qa -->", tmp_path)


def test_engine_runs_keep_their_numbers_when_the_oldest_is_dropped(tmp_path, monkeypatch):
    from bench import doc_tables, engine_policies

    output = tmp_path / "policies.json"
    base = json.loads((RESULTS / "policies.json").read_text(encoding="utf-8"))["workloads"]["crawler"]["engine"]
    base = {k: v for k, v in base.items() if k != "earlier_runs"}
    base.pop("run_number", None)
    monkeypatch.setattr(engine_policies, "KEPT_RUNS", 2)
    for commit in ("aaaa", "bbbb", "cccc", "dddd"):
        engine_policies.write({**base, META_KEY: {**base[META_KEY], "commit": commit}}, output)
    rendered = doc_tables.engine_policies(json.loads(output.read_text(encoding="utf-8")))
    headings = [line.split(":")[0] for line in rendered.splitlines() if line.startswith("Run ")]
    assert headings == ["Run 4 of 4 (commit dddd; the file also keeps runs 2, 3)"]
