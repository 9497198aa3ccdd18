"""The cluster simulation's tables (`bench.cluster_sim`), rendered into docs/BENCHMARKS_COMPONENTS.md."""

from __future__ import annotations

import statistics

from bench.doc_tables import num, seconds, table


def cluster_sim(data: dict) -> str:
    routers = data["routers"]
    cells = data["cells"]
    rows = []
    for key, cell in cells.items():
        if cell["load"] != 0.8:
            continue
        per = cell["routers"]
        ratio = per["central"]["ttft_p99_s"] / per["pow2"]["ttft_p99_s"]
        rows.append([str(cell["replicas"]), cell["shape"], cell["arrivals"], f"{cell['sessions']:,}",
                     *[seconds(per[r]["ttft_p99_s"]) for r in routers], num(ratio),
                     *[num(per[r]["goodput_frac"]) for r in ("central", "pow2")]])
    at_80 = table(["replicas", "shape", "arrivals", "sessions", *[f"P99 {r}" for r in routers],
                   "central / pow2 P99", "goodput central", "goodput pow2"], rows)
    summary = []
    for r in routers:
        vals = [c["routers"][r] for c in cells.values()]
        summary.append([r, seconds(statistics.median(v["ttft_p50_s"] for v in vals)),
                        seconds(statistics.median(v["ttft_p99_s"] for v in vals)),
                        num(statistics.median(v["goodput_frac"] for v in vals)),
                        f"{sum(v['preemptions'] for v in vals):,}"])
    overall = table(["router", "median P50", "median P99", "median goodput", "preemptions, all cells"], summary)
    head = data["central_vs_pow2_p99_ratio_64_at_80"]
    verdict = "no 64-replica cells" if head is None else ("met" if data["met"] else "**missed**")
    text = (f"{at_80}\n\nAll {len(cells)} cells (loads {', '.join(sorted({str(c['load']) for c in cells.values()}))}):\n\n"
            f"{overall}\n\n"
            f"Goodput: the share of sessions whose TTFT is at most {num(data['ttft_slo_s'])} s. "
            f"`central_vs_pow2_p99_ratio_64_at_80` (the worst 64-replica cell at 80% load): {num(head)}, "
            f"target <= {num(data['targets']['central_vs_pow2_p99_ratio_64_at_80'])} ({verdict}). "
            f"Sessions per cell: {data['sessions_per_cell']}; {data['kv_blocks_per_replica']:,} KV blocks of "
            f"{data['block_size']} tokens per replica; load: {data['load_definition']}; pow2 router instances: "
            f"{data['pow2_router_instances']}.")
    why = data.get("why_missed")
    if why:
        text += f" Why missed: {why['reason']} What would reach it: {why['what_would_reach_it']}"
    return text
