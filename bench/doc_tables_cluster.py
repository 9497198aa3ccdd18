"""The cluster simulation's tables (`bench.cluster_sim`, docs/BENCHMARKS_COMPONENTS.md) and the at-scale
reliability drill's (`bench.reliability --scale`, docs/BENCHMARKS.md)."""

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


FAULT_NAMES = {"replica_kill": "replica kill", "ingress_kill": "ingress kill", "central_restart": "central restart",
               "shard_kill": "shard kill", "node_removal": "node removal"}


def reliability_scale(data: dict) -> str:
    """The at-scale drill: outcomes, then each fault (when, what it hit, what became of those
    sessions), then why any session was asked again."""
    c = data["counts"]
    text = table(["offered", "answered", "rejected 429", "failed", "lost", "disconnected (on purpose)", "recovered",
                  "resumed", "taken over", "sent again (unstarted)", "asked again"],
                 [[c["offered"], c["answered"], c["rejected"], c["failed"], c["lost"], c["disconnected"],
                   data["recovered"], data["resumed"], data["took_over"], data["retried_unstarted"], data["reasked"]]])
    rows = []
    for f in data["faults"]:
        hit = f.get("affected", {})
        fired = f.get("fired", f.get("killed"))
        rows.append([FAULT_NAMES.get(f.get("fault"), f.get("fault")), num(f.get("at_s")) if fired else "not fired",
                     _what(f), hit.get("sessions", 0),
                     ", ".join(f"{k} {v}" for k, v in sorted(hit.get("outcomes", {}).items())) or "none",
                     hit.get("recovered", 0), hit.get("resumed", 0), hit.get("reasked", 0)])
    text += "\n\n" + table(["fault", "at s", "what", "sessions hit", "their outcomes", "recovered", "resumed",
                            "asked again"], rows)
    kv = data["kv_baseline_vs_after"]
    text += (f"\n\nKV blocks: {kv['baseline_blocks']} before the load, {num(kv['after_blocks'])} after it "
             f"(back to baseline: {num(kv['back_to_baseline'])}); load {num(data['load_s'])} s.")
    why = data["reask_reasons"]
    if data["reasked"]:
        text += " Asked again: " + "; ".join(f"{n} x {k} ({why['why'].get(k, 'a resume was possible: counted lost')})"
                                              for k, n in sorted(why["counts"].items())) + "."
    return text


def _what(fault: dict) -> str:
    kind = fault.get("fault")
    if kind in ("replica_kill", "ingress_kill"):
        return f"replica {fault.get('replica_id')}"
    if kind == "node_removal":
        held = (f"its replica(s) {', '.join(fault['replicas'])}" if fault.get("replicas") else
                "**no engine replica was reporting from it** (none hit)")
        after = num(round(fault["replaced_at_s"] - fault["at_s"], 1)) if "replaced_at_s" in fault else "-"
        return f"worker node, {held}; a new node after {after} s"
    if kind == "central_restart":
        return f"central scheduler, back after {num(fault.get('back_after_s'))} s"
    if kind == "shard_kill":
        return f"shard {fault.get('shard_index')} of {fault.get('shards')}, back after {num(fault.get('back_after_s'))} s"
    return ""
