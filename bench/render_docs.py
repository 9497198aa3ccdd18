"""Render the results tables of docs/BENCHMARKS*.md and the README from bench/results/*.json.

    python -m bench.render_docs            # rewrite every generated block in place
    python -m bench.render_docs --check    # exit 1 when a committed block differs from its JSON

A generated block is the text between `<!-- results:NAME -->` and `<!-- /results:NAME -->`;
`REGISTRY[NAME]` names its results file and the function (`bench.doc_tables`) that renders it.
Another benchmark is added with one registry entry and one marker pair. A marker naming no entry,
or an entry whose file is missing, is an error. Text outside the blocks is left alone.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench import claims, doc_tables, doc_tables_cluster

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
DOCS = (ROOT / "docs" / "BENCHMARKS.md", ROOT / "docs" / "BENCHMARKS_COMPONENTS.md", ROOT / "README.md")
BLOCK = re.compile(r"(<!-- results:([\w.-]+) -->\n)(.*?)(<!-- /results:\2 -->)", re.S)


class RenderError(ValueError):
    """A marker without a registry entry, or a results file that is missing."""


@dataclass(frozen=True)
class Entry:
    results: str | tuple[str, ...]  # path(s) under bench/results/; the renderer gets one dict per path
    render: Callable[..., str]
    # the part of the (single) file the block shows, when that part records its own provenance
    part: Callable[[dict], dict] | None = None
    # the block's provenance text from its files' JSON, instead of one `doc_tables.provenance` line each
    provenance: Callable[..., str] | None = None

    @property
    def files(self) -> tuple[str, ...]:
        return (self.results,) if isinstance(self.results, str) else self.results


REGISTRY: dict[str, Entry] = {
    "claims": Entry(claims.files(), claims.render, provenance=lambda *datas: _claims_provenance(datas)),
    "engine_ttft": Entry("engine_ttft.json", doc_tables.engine_ttft),
    "engine_ttft_long_gap": Entry("engine_ttft_long_gap.json", doc_tables.engine_ttft),
    "cpu_dtype": Entry("cpu_dtype.json", doc_tables.cpu_dtype),
    "central": Entry("central.json", doc_tables.central),
    "cluster_sim": Entry("cluster_sim.json", doc_tables_cluster.cluster_sim),
    "engine_load": Entry("engine_load.json", doc_tables.engine_load),
    "pipeline": Entry("pipeline.json", doc_tables.pipeline),
    "qa": Entry("qa.json", doc_tables.qa),
    "reliability": Entry("reliability.json", doc_tables.reliability),
    "reliability_scale": Entry("reliability_scale.json", doc_tables_cluster.reliability_scale),
    "soak": Entry("soak.json", doc_tables.soak),
    "policies": Entry("policies.json", doc_tables.policies),
    "scheduler_overhead": Entry("scheduler_overhead.json", doc_tables.scheduler_overhead),
    "retrievers": Entry("retrievers.json", doc_tables.retrievers),
    "vs_vllm_serve": Entry("vs_vllm_serve.json", doc_tables.vs_vllm_serve),
    "vs_vllm_serve_reserved1": Entry("vs_vllm_serve_reserved1.json", doc_tables.vs_vllm_serve),
    "vs_vllm_serve_control_loop_1s": Entry("vs_vllm_serve_control_loop_1s.json", doc_tables.vs_vllm_serve),
    "engine_policies": Entry("policies.json", doc_tables.engine_policies, doc_tables.engine_entry),
    "readme_figures": Entry(("engine_ttft.json", "engine_ttft_long_gap.json", "pipeline.json", "qa.json",
                             "reliability.json"), doc_tables.readme_figures),
}


def _claims_provenance(datas: tuple[dict, ...]) -> str:
    shown = {file for name, entry in REGISTRY.items() if name != "claims" for file in entry.files}
    return claims.provenance(dict(zip(claims.files(), datas)), shown)


def render_block(name: str, results_dir: Path = RESULTS) -> str:
    """The generated text of block `name`: its table and provenance line."""
    entry = REGISTRY.get(name)
    if entry is None:
        raise RenderError(f"no renderer for block {name!r}; known: {', '.join(sorted(REGISTRY))}")
    datas = []
    for file in entry.files:
        path = results_dir / file
        if not path.is_file():
            raise RenderError(f"block {name!r}: results file {path} is missing")
        datas.append(json.loads(path.read_text(encoding="utf-8")))
    if entry.provenance is not None:
        return f"{entry.render(*datas)}\n\n{entry.provenance(*datas)}\n"
    origins = [entry.part(d) for d in datas] if entry.part else datas
    lines = "\n".join(f"- {doc_tables.provenance(f, d)}" if len(datas) > 1 else doc_tables.provenance(f, d)
                      for f, d in zip(entry.files, origins))
    return f"{entry.render(*datas)}\n\n{lines}\n"


def render_text(text: str, results_dir: Path = RESULTS) -> str:
    """`text` with every generated block re-rendered."""
    return BLOCK.sub(lambda m: m.group(1) + render_block(m.group(2), results_dir) + m.group(4), text)


def stale_blocks(text: str, results_dir: Path = RESULTS) -> list[str]:
    """Names of the blocks whose committed text differs from what their results render to."""
    return [m.group(2) for m in BLOCK.finditer(text) if m.group(3) != render_block(m.group(2), results_dir)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when a block is stale")
    parser.add_argument("files", nargs="*", type=Path, default=list(DOCS))
    args = parser.parse_args(argv)
    stale = []
    for path in args.files:
        text = path.read_text(encoding="utf-8")
        if args.check:
            stale += [f"{path.name}: {name}" for name in stale_blocks(text)]
        else:
            path.write_text(render_text(text), encoding="utf-8")
            print(f"rendered {path} ({len(BLOCK.findall(text))} blocks)")
    for item in stale:
        print(f"stale: {item} (run python -m bench.render_docs)", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
