"""Markdown tables rendered from results files (pure): one function per results file, each taking
the loaded JSON and returning the table that `docs/BENCHMARKS.md` (and the README) show.

Every table ends with its provenance line (`provenance`): the file, and the run's commit, date,
machine, model, dtype and seeds, or which of those the file does not record.
"""

from __future__ import annotations

import statistics

from bench.engine_load import REPLAY_ORDER_PER_ENGINE
from bench.results_meta import META_KEY, missing_metadata, run_number
from stream2llm.data.traces import PromptMode

MISSING = "n/a"


def num(value, digits: int = 3, unit: str = "") -> str:
    """A number with `digits` significant digits (thousands separated), or n/a."""
    if value is None:
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}{unit}"
    text = f"{value:,.{digits}g}" if abs(value) < 10 ** digits else f"{value:,.0f}"
    return text + unit


def seconds(value) -> str:
    return num(value, 3, " s")


def ms(value) -> str:
    return num(value, 3, " ms")


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def known_from_file(data: dict) -> dict:
    """Metadata a file written before `meta` existed states elsewhere (its own fields), else {}."""
    config = data.get("config") or data.get("setup") or {}
    known = {"date_utc": data.get("measured_at"), "model": config.get("model"), "dtype": config.get("dtype")}
    return {k: v for k, v in known.items() if v}


def provenance(name: str, data: dict) -> str:
    """`Results: bench/results/NAME; commit ..., date, machine ...` and what the file does not record."""
    meta = {**known_from_file(data), **(data.get(META_KEY) or {})}
    parts = []
    if meta.get("commit"):
        parts.append(f"commit {meta['commit'][:10]}" + (" (uncommitted changes)" if meta.get("dirty") else ""))
    if meta.get("date_utc"):
        parts.append(meta["date_utc"][:16].replace("T", " ") + (" UTC" if META_KEY in data else ""))
    machine = meta.get("machine") or {}
    if machine:
        load = f", load {machine['load_avg_before'][0]:.1f} -> {machine['load_avg_after'][0]:.1f}"
        gpus = f", {len(machine['gpus'])} GPU(s) {machine['gpus'][0]}" if machine.get("gpus") else ""
        parts.append(f"{machine['cores']} cores{_cpu(machine)}{gpus}{load}")
    parts += [str(meta[k]) for k in ("model", "dtype") if meta.get(k)]
    parts += [f"no {k}" for k in ("model", "dtype") if META_KEY in data and k in data[META_KEY] and data[META_KEY][k] is None]
    if meta.get("seeds") is not None:
        parts.append(f"seeds {meta['seeds']}" if meta["seeds"] else "no seeds")
    line = f"Results: `bench/results/{name}`" + (f"; {', '.join(parts)}" if parts else "")
    missing = [k for k in missing_metadata(data) if not meta.get(k)]
    if missing:
        line += f". **Not recorded: {', '.join(missing)}**"
        if meta.get("note"):
            line += f" ({meta['note'].rstrip('.')})"
    return line + "."


def _cpu(machine: dict) -> str:
    """` of <CPU model> (native bfloat16: yes|no)` where the file records them."""
    text = f" of {machine['cpu_model']}" if machine.get("cpu_model") else ""
    if machine.get("cpu_bf16") is not None:
        text += f" (native bfloat16: {num(machine['cpu_bf16'])})"
    return text


def engine_ttft(data: dict) -> str:
    rows = [[mode, seconds(data[mode]["ttft_p50_s"]), seconds(data[mode]["ttft_p95_s"])]
            for mode in (PromptMode.STREAM, PromptMode.ONESHOT, "floor")]
    cfg = data.get("config", {})
    return (table(["", "TTFT p50", "TTFT p95"], rows) + "\n\n"
            f"{cfg.get('sessions', MISSING)} sessions x {cfg.get('chunks', MISSING)} chunks of ~{cfg.get('chunk_tokens', MISSING)} "
            f"tokens, {cfg.get('gap', MISSING)} s apart. `speedup_p50` {num(data['speedup_p50'])}, `floor_ratio_p50` "
            f"{num(data['floor_ratio_p50'])} (target <= 1.3), `outputs_identical` {num(data['outputs_identical'])}"
            + (f" ({num(data['identical_fraction'])} of sessions)" if "identical_fraction" in data else "") + ".")


def cpu_dtype(data: dict) -> str:
    rows = [[dtype, seconds(d["ttft_median_s"]), num(d["prefill_tokens_per_s"], 3, " tokens/s"), len(d["ttft_s"])]
            for dtype, d in data["dtypes"].items()]
    machine = (data.get(META_KEY) or {}).get("machine") or {}
    return (table(["dtype", "cold prefill + 1 token, median", "prefill rate", "runs"], rows) + "\n\n"
            f"{data['prompt_tokens']:,}-token prompt; CPU {machine.get('cpu_model') or MISSING}, native bfloat16: "
            f"{num(machine.get('cpu_bf16'))}. `float32_speedup` {num(data['float32_speedup'])}; the engine's default "
            f"here is {data['default_dtype']}: `default_is_fastest` {num(data['default_is_fastest'])}.")


def engine_load(data: dict) -> str:
    """Median over seeds of TTFT p50 / p99 per (policy, mode) and QPS level, then the summary keys."""
    levels = [str(q) for q in data["qps"]]
    rows = []
    for policy, modes in data["runs"].items():
        for mode, per_qps in modes.items():
            cells = [f"{num(statistics.median(r['ttft_p50_s'] for r in per_qps[q].values()))} / "
                     f"{num(statistics.median(r['ttft_p99_s'] for r in per_qps[q].values()))}" for q in levels]
            rows.append([policy, mode, *cells])
    summary = data["summary"]
    return (table(["policy", "mode", *(f"QPS {q}: TTFT p50 / p99 (s)" for q in levels)], rows) + "\n\n"
            f"{data['sessions']} sessions per run, seeds {data[META_KEY]['seeds']}, "
            f"KV {data['kv_bytes'] / 2**20:.0f} MiB, replay order: {data.get('replay_order', REPLAY_ORDER_PER_ENGINE)}. "
            f"`stream_vs_oneshot_worst_ratio` "
            f"{num(summary['stream_vs_oneshot_worst_ratio'])} (target <= 1.0; as a ratio of medians "
            f"{num(summary['stream_vs_oneshot_worst_ratio_of_medians'])}), `light_load_speedup_p50` "
            f"{num(summary['light_load_speedup_p50'])} (target >= 3), `tailguard_lowest_p99` "
            f"{num(summary['tailguard_lowest_p99'])} (seeds won per top level: "
            f"{_per_level(summary['tailguard_p99_lowest_seeds'])}).")


def _per_level(counts: dict) -> str:
    """`{"2.0": 1}` as "QPS 2: 1" (a line a reader sees, not a Python dict)."""
    return ", ".join(f"QPS {num(float(level))}: {n}" for level, n in counts.items()) or "none"


def central(data: dict) -> str:
    sat, target, bare = data["saturated"], data["at_target_rate"], data["without_slots"]
    rate = f"{target['offered_admits_per_s']:,}/s offered"

    def row(label, d, load):
        return [label, load, num(d["admits_per_s"]), ms(d["admit_p50_ms"]), ms(d["admit_p99_ms"]),
                num(d["actor_calls_per_admit"]), num(d.get("from_slots_frac", 0))]
    rows = [row(f"ingress client, {data['slots']} slots (headline)", sat, "saturating"),
            row(f"ingress client, {data['slots']} slots (headline)", target, rate),
            row("batched, no slots", bare["saturated"], "saturating"),
            row("batched, no slots", bare["at_target_rate"], rate),
            row("one actor call per operation", data["unbatched"], "saturating")]
    rtt = data["ray_round_trip"]
    rows.append(["bare Ray round trip (one caller, empty call)", "one at a time", MISSING, ms(rtt["p50_ms"]),
                 ms(rtt["p99_ms"]), "1", "0"])
    met, logic = data["met"], data["logic_in_process"]
    return (table(["callers", "load", "admissions/s", "p50", "p99", "actor calls per admission",
                   "from slots"], rows) + "\n\n" +
            f"Headline rows: median of {sat['repeats']} runs each (admissions/s {num(sat['spread']['admits_per_s'][0])} "
            f"to {num(sat['spread']['admits_per_s'][1])} saturating; p99 {ms(target['spread']['admit_p99_ms'][0])} to "
            f"{ms(target['spread']['admit_p99_ms'][1])} at {rate}); the other rows one run. "
            f"The admission logic alone (in-process, no Ray, same scale): {num(logic['us_per_admit_release'])} µs "
            f"per admit+release, {ms(logic['ms_per_report_round'])} per round of all replicas' reports. "
            f"{data['replicas']} simulated replicas reporting every {num(data['report_interval_s'])} s, "
            f"{data['open_sessions']:,} open sessions, {data['generators']} load processes; saturating: "
            f"{sat['concurrency_per_generator']} concurrent callers each; late report rounds {data['late_rounds']}. "
            f"Targets: >= {data['targets']['admits_per_s']:,} admissions/s saturating "
            f"({'met' if met['admits_per_s'] else '**missed**'}), p99 < {num(data['targets']['admit_p99_ms'])} ms "
            f"at {rate} ({'met' if met['admit_p99_ms'] else '**missed**'}).")


def pipeline(data: dict) -> str:
    s, o = data[PromptMode.STREAM], data[PromptMode.ONESHOT]
    keys = [("TTFT p50", "ttft_p50_s"), ("TTFT p95", "ttft_p95_s"), ("TTFT p99", "ttft_p99_s"),
            ("end-to-end p50", "e2e_p50_s"), ("end-to-end p99", "e2e_p99_s"),
            ("answered sessions per second", "sessions_per_s"), ("makespan", "makespan_s"),
            ("pipeline overhead p50 (client minus engine TTFT)", "pipeline_overhead_p50_s")]
    fmt = {"sessions_per_s": num, "pipeline_overhead_p50_s": lambda v: ms(_ms(v))}
    rows = [[label, fmt.get(key, seconds)(s.get(key)), fmt.get(key, seconds)(o.get(key))] for label, key in keys]
    rows += _serving_rows(s.get("serving"), o.get("serving"))
    if s.get("ingress") and o.get("ingress"):
        si, oi = s["ingress"], o["ingress"]
        rows += [["Ray hops per context piece", num(si["ray_hops_per_chunk"]), num(oi["ray_hops_per_chunk"])],
                 ["ingress CPU per session", seconds(si["ingress_cpu_s_per_session"]),
                  seconds(oi["ingress_cpu_s_per_session"])],
                 ["chunk text through the ingress per session", f"{num(si['ingress_chunk_bytes_per_session'])} B",
                  f"{num(oi['ingress_chunk_bytes_per_session'])} B"]]
    ratio = data.get("throughput_ratio")
    verdict = MISSING if ratio is None else ("met" if ratio >= data.get("throughput_target", 0.95) else "**missed**")
    return (table(["", "stream", "one-shot"], rows) + "\n\n"
            f"Load: {data.get('load', 'open loop (Poisson)')}; {data.get('sessions', MISSING)} sessions per mode. "
            f"`throughput_ratio` {num(ratio)} (target >= 0.95: {verdict}), `speedup_p50` {num(data['speedup_p50'])}, "
            f"{data['failed']} failed, {data['rejected']} rejected.")


def _serving_rows(s: dict | None, o: dict | None) -> list[list[str]]:
    if not s or not o:
        return []
    keys = [("median / p99 TTFT (vLLM names)", "median_ttft_ms", "p99_ttft_ms"),
            ("median / p99 TPOT", "median_tpot_ms", "p99_tpot_ms"),
            ("median / p99 ITL", "median_itl_ms", "p99_itl_ms"),
            ("median / p99 E2EL", "median_e2el_ms", "p99_e2el_ms")]
    rows = [[label, f"{ms(s[a])} / {ms(s[b])}", f"{ms(o[a])} / {ms(o[b])}"] for label, a, b in keys]
    if s.get("request_goodput") is not None:
        slos = ", ".join(f"{name.upper()} <= {ms(bound)}" for name, bound in s["goodput_slos_ms"].items())
        rows.append([f"request goodput ({slos})", num(s["request_goodput"], 3, " req/s"),
                     num(o["request_goodput"], 3, " req/s")])
    return rows


def _ms(value):
    return None if value is None else value * 1e3


def _acc(a: dict) -> str:
    return f"{num(a['rate'])} [{num(a['ci95'][0])}, {num(a['ci95'][1])}] ({a['correct']}/{a['n']})"


def qa(data: dict) -> str:
    rows = []
    for name, s in data["sources"].items():
        rows.append([name, "all", _acc(s["accuracy_stream"]), _acc(s["accuracy_oneshot"]),
                     f"{s['identical_answers']}/{s['questions']}", f"{s['same_citations']}/{s['questions']}",
                     num(s.get("tokens_prefilled_before_finish_p50")),
                     f"{seconds(s['ttft_p50_s']['stream'])} / {seconds(s['ttft_p50_s']['oneshot'])}"])
        if len(s["by_kind"]) > 1:
            rows += [[name, kind, _acc(k["stream"]), _acc(k["oneshot"]), "", "", "", ""]
                     for kind, k in s["by_kind"].items()]
    return table(["source", "kind", "accuracy stream [95% CI]", "accuracy one-shot [95% CI]", "identical answers",
                  "same citations", "tokens prefilled early (p50)", "TTFT p50 stream / one-shot"], rows)


def reliability(data: dict) -> str:
    c = data["counts"]
    row = [c["offered"], c["answered"], c["rejected"], c["failed"], c.get("lost", MISSING), c["disconnected"],
           data["recovered"]]
    text = table(["offered", "answered", "rejected 429", "failed", "lost", "disconnected (on purpose)",
                  "recovered after kill"], [row])
    kill, leaks = data.get("kill", {}), data["leaks"]
    dropped = kill.get("dropped_by_controller_s")
    routing = ("" if "dropped_by_controller_s" not in kill else
               f", dropped from Serve's running replicas after {seconds(dropped)}" if dropped is not None
               else ", drop not timed (not yet running for Serve when killed)" if not kill.get("was_routable")
               else ", **still listed as running after 60 s**")
    after_ttl = leaks.get("after_ttl")
    drained = num(leaks.get("drained")) + (
        "" if leaks.get("drained") or not after_ttl else
        f" (left open: {leaks.get('replica_sessions')} session(s), {leaks.get('kv_blocks_used')} KV blocks; "
        f"drained by the idle-session TTL: {num(after_ttl.get('drained'))})")
    left = kill.get("left_routers_s")
    if left:
        routing += ("; the ingress routers (" + str(len(left)) + ") let go of it after: " + ", ".join(
            seconds(v) if isinstance(v, (int, float)) else f"{v} it" if v else "**still listed after 30 s**"
            for v in left.values()))
    text += (f"\n\nReplica kill: {'at ' + num(kill.get('at_s')) + ' s' if kill.get('killed') else 'not done'}"
             f"{routing}; drained: {drained}; latency p50 {seconds(data['latency_s']['p50'])}, "
             f"p95 {seconds(data['latency_s']['p95'])}.")
    ingress = data.get("ingress_kill")
    if ingress and ingress.get("killed"):
        text += (f"\n\nIngress kill: one of {ingress['ingress_replicas']} ingress replicas at {num(ingress['at_s'])} s, "
                 f"dropped from Serve's running replicas after {seconds(ingress['dropped_by_controller_s'])}; "
                 f"streams cut: {ingress['sessions_cut']} ({ingress['cut_on_the_killed_ingress']} on the killed ingress, "
                 f"{ingress['refused_by_proxy']} refused by the proxy for it); resumed with Last-Event-ID: "
                 f"{data['resumed']}, asked again: {data['reasked']}; their outcomes: "
                 f"{', '.join(f'{k} {v}' for k, v in sorted(ingress['cut_outcomes'].items())) or 'none'}.")
    elif ingress is not None:
        text += f"\n\nIngress kill: not done ({ingress.get('reason', 'not asked for')})."
    if "serving" not in data:
        text += " `lost` in this file is a subset of `failed` (recorded before they were separated)."
    return text


def soak(data: dict) -> str:
    rows = [[name, r["requests"], r["failures"], num(r["p50_ms"]), num(r["p95_ms"]), num(r["p99_ms"])]
            for name, r in sorted(data["by_request"].items())]
    text = table(["request", "requests", "failures", "p50 ms", "p95 ms", "p99 ms"], rows)
    kinds = "; ".join(f"{f['request']}: {f['kind']} x{f['count']}" for f in data["failures_by_kind"]) or "none"
    end = data["end"]
    text += (f"\n\n{data['users']} users for {data['duration_s']} s: {num(data['requests'])} requests, {num(data['failures'])} "
             f"failed ({kinds}). At the end: drained {num(data['drained'])}, KV blocks {end.get('kv_blocks_used')} "
             f"(idle level {end.get('idle_kv_blocks')}), leaks: {data['leaks'] or 'none'}.")
    return text


POLICY_ORDER = ("default_vllm", "fcfs", "lcas", "mcps", "tailguard")


def policies(data: dict) -> str:
    rows = []
    for name, w in data["workloads"].items():
        sim = w["sim"]
        streamed = sim[PromptMode.STREAM]
        p99 = [num(streamed[p]["ttft_p99_s"]) for p in POLICY_ORDER if p in streamed]
        base = sim[PromptMode.ONESHOT]
        rows.append([f"{name}: {w['num_requests']:,} requests, {num(w['delay'])}x delay, QPS {num(w['qps'])}",
                     *p99, num(next(iter(base.values()))["ttft_p99_s"] if "ttft_p99_s" not in base
                               else base["ttft_p99_s"])])
    text = table(["scenario (P99 TTFT, s)", *POLICY_ORDER, "one-shot"], rows)
    versus = {name: w["tailguard_vs_oneshot"] for name, w in data["workloads"].items() if "tailguard_vs_oneshot" in w}
    if versus:
        seeds = sorted({seed for per in versus.values() for seed in per}, key=int)
        cells = [[name, *(_versus_cell(per.get(seed)) for seed in seeds)] for name, per in versus.items()]
        held = [v["p99_at_most_oneshot"] for per in versus.values() for v in per.values()]
        text += ("\n\nTailGuard streamed vs one-shot (default_vllm), per trace seed: P99 ratio (<= 1 is the "
                 "target) / P50 speed-up\n\n" + table(["scenario", *(f"seed {s}" for s in seeds)], cells)
                 + f"\n\nTailGuard's P99 at most the one-shot P99 in {sum(held)} of {len(held)} (scenario, seed) runs.")
    busy = []
    for name, w in data["workloads"].items():
        tail, base = w["sim"][PromptMode.STREAM]["tailguard"], w["sim"][PromptMode.ONESHOT]["default_vllm"]
        if "busy_s" in tail:
            busy.append([name, num(tail["busy_s"]), num(base["busy_s"]), num(tail["busy_s"] / base["busy_s"]),
                         f"{tail['tokens_recomputed']:,}", num(tail.get("swaps_dropped"))])
    if busy:
        text += ("\n\nEngine busy time (prefill + recompute + decode, s), trace seed 0: the work each mode "
                 "costs, which the makespan hides\n\n"
                 + table(["scenario", "TailGuard streamed", "one-shot", "ratio", "tokens recomputed",
                         "swapped KV dropped"], busy))
    return text


def _versus_cell(v: dict | None) -> str:
    if v is None:
        return "-"
    ratio = num(v["p99_ratio"])
    return f"{ratio if v['p99_at_most_oneshot'] else f'**{ratio}**'} / {num(v['p50_speedup'])}x"


def scheduler_overhead(data: dict) -> str:
    sizes = sorted({int(n) for per in data["us_per_step"].values() for n in per})
    rows = [[p, *(num(per.get(str(n))) for n in sizes)] for p, per in data["us_per_step"].items()]
    text = (table(["policy", *(f"µs per step at {n:,} requests" for n in sizes)], rows) + "\n\n"
            f"{data['changed_per_step']} requests changing per step, {data['statistic']} of {data['repeats']}.")
    plugin = data.get("plugin_us_per_step")
    if plugin:
        prows = [[p, *(num(per.get(str(n))) for n in sizes)] for p, per in plugin.items()]
        verdict = "met" if data["plugin_meets_target"] else "**missed**"
        text += ("\n\nThe vLLM plug-in's own step code on real `Request` objects (`plugin_us_per_step`, best of "
                 f"{data.get('plugin_repeats', 2)} seeds):\n\n"
                 + table(["policy", *(f"µs per step at {n:,} sessions" for n in sizes)], prows) + "\n\n"
                 f"Target <= {num(data['plugin_target_us_at_500'])} µs at 500: {verdict}.")
    contended = data.get("plugin_contended_us_per_step")
    if contended:
        budgets = data["plugin_budgets"]
        crows = [[p, *(num(per.get(str(n))) for n in sizes)] for p, per in contended.items()]
        text += (f"\n\nWith a {budgets['plugin_us_per_step']:,}-token budget the step's new chunks fit it whole, so vLLM "
                 "schedules them in any order and the plug-in does not sort. With a "
                 f"{budgets['plugin_contended_us_per_step']:,}-token budget, less than their work, the order decides "
                 "who runs and the queues are sorted (`plugin_contended_us_per_step`):\n\n"
                 + table(["policy", *(f"µs per step at {n:,} sessions" for n in sizes)], crows))
        if "plugin_contended_meets_target" in data:
            verdict = "met" if data["plugin_contended_meets_target"] else "**missed**"
            text += f"\n\nTarget <= {num(data['plugin_target_us_at_500'])} µs at 500 when the queues are sorted: {verdict}."
        ratios = data.get("plugin_contended_over_plain_at_500")
        if ratios:
            text += ("\n\nSorted step over unsorted step at 500 sessions, both from this run: "
                     + ", ".join(f"{p} {num(r)}x" for p, r in ratios.items()) + ".")
    return text


def retrievers(data: dict) -> str:
    c, v = data["crawler"], data["vector"]
    rows = [["crawler, local site with zero latency", num(c["zero_latency"]["pages_per_s"], 3, " pages/s")],
            ["extraction during the crawl / one thread, warm",
             f"{ms(c['zero_latency']['extract_ms_per_page_in_crawl'])} / {ms(c['extract_ms_per_page_serial'])} per page"],
            ["crawler at workload latency: first page / whole query (median)",
             f"{seconds(c['workload_latency']['first_page_s_median'])} / {seconds(c['workload_latency']['query_s_median'])}"],
            ["embedding (all-MiniLM-L6-v2, CPU)", num(v["embedding_chunks_per_s"], 3, " chunks/s")],
            ["vector: first / final result / exact search (p50, query embedding included)",
             f"{ms(v['first_result_ms_p50'])} / {ms(v['final_result_ms_p50'])} / {ms(v['exact_search_ms_p50'])}"],
            [f"recall@{v['k']} on {v['questions']} grounded questions, final / first event",
             f"{num(v['recall_at_5'])} / {num(v['recall_at_5_first_event'])}"],
            ["final progressive event equal to exact search", num(v["final_equals_exact"])]]
    return table(["measure", "value"], rows) + f"\n\nIndex: {v['documents']:,} documents, {v['chunks']:,} chunks."


def _policy_cells(results: dict) -> list[list[str]]:
    rows = []
    for mode in (PromptMode.ONESHOT, PromptMode.STREAM):
        for policy, r in results.get(mode, {}).items():
            label = "one-shot" if mode == PromptMode.ONESHOT else policy
            rows.append([label, f"{num(r['ttft_p50_s'])} / {num(r['ttft_p95_s'])} / {num(r['ttft_p99_s'])}",
                         r["preemptions"], num(r["makespan_s"])])
    return rows


def engine_entry(data: dict) -> dict:
    """policies.json's real-engine run (`bench.engine_policies`), kept across the simulator's runs."""
    return data["workloads"]["crawler"]["engine"]


def engine_policies(data: dict) -> str:
    """Policies on the real CPU engine (`policies.json` workloads.crawler.engine): the newest run;
    the earlier runs the file keeps are named, not shown."""
    e = engine_entry(data)
    last, earlier = run_number(e), e.get("earlier_runs", [])  # earlier_runs: newest first
    # a run kept from before `run_number` existed counts back from the newest
    kept = sorted(run.get("run_number") or last - 1 - i for i, run in enumerate(earlier))
    commit = (e.get(META_KEY) or {}).get("commit")
    origin = f"commit {commit[:10]}" if commit else "commit not recorded"
    also = f"; the file also keeps runs {', '.join(map(str, kept))}" if kept else ""
    parts = [f"Run {last} of {last} ({origin}{also}): TTFT p50 / p95 / p99 (s), preemptions, makespan (s)\n\n"
             + table(["policy", "TTFT p50 / p95 / p99", "preemptions", "makespan"], _policy_cells(e["results"]))]
    err = e.get("sim_vs_engine", {})
    parts.append(f"{e['sessions']} sessions, QPS {num(e['qps'])}, seed {e['seed']}, {e['kv_tokens']:,} KV tokens, "
                 f"{e['model']}. Simulator vs engine (same trace, calibrated cost model): median relative error "
                 f"of p50 and p95 {num(err.get('median_abs_rel_error_p50_p95'))}, max "
                 f"{num(err.get('max_abs_rel_error_p50_p95'))}, tolerance {num(err.get('tolerance_rel'))}: "
                 f"{'within' if err.get('within_tolerance') else '**outside**'}. "
                 f"Median relative error of p50 and p99 {num(_median_error(err, 'ttft_p99_s'))}.")
    return "\n\n".join(parts)


def _median_error(comparison: dict, tail: str) -> float | None:
    """Median |relative error| of the simulator's p50 and `tail` TTFT over the compared runs."""
    errors = [abs(row[k]["rel_error"]) for runs in comparison.get("runs", {}).values()
              for row in runs.values() for k in ("ttft_p50_s", tail)]
    return statistics.median(errors) if errors else None


def readme_figures(engine: dict, long_gap: dict, pipe: dict, qa_data: dict, rel: dict) -> str:
    """The README's headline figures, each from its results file."""
    rows = [[f"8 x 800 tokens, {engine['config']['gap']} s gaps", seconds(engine[PromptMode.STREAM]["ttft_p50_s"]),
             seconds(engine[PromptMode.ONESHOT]["ttft_p50_s"]), seconds(engine["floor"]["ttft_p50_s"]),
             num(engine["speedup_p50"]), num(engine["floor_ratio_p50"])],
            [f"same, {long_gap['config']['gap']} s gaps", seconds(long_gap[PromptMode.STREAM]["ttft_p50_s"]),
             seconds(long_gap[PromptMode.ONESHOT]["ttft_p50_s"]), seconds(long_gap["floor"]["ttft_p50_s"]),
             num(long_gap["speedup_p50"]), num(long_gap["floor_ratio_p50"])]]
    vector = qa_data["sources"]["vector"]
    c = rel["counts"]
    return (table(["engine workload", "TTFT stream p50", "one-shot p50", "floor p50", "speedup", "stream / floor"],
                  rows) + "\n\n"
            f"- `bench.pipeline` ({pipe.get('load', 'open loop')}): "
            f"TTFT p50 {seconds(pipe[PromptMode.STREAM]['ttft_p50_s'])} "
            f"streamed vs {seconds(pipe[PromptMode.ONESHOT]['ttft_p50_s'])} one-shot; throughput ratio "
            f"{num(pipe.get('throughput_ratio'))} (target >= 0.95).\n"
            f"- `bench.qa` (vector source, strict judge): accuracy {_acc(vector['accuracy_stream'])} streamed, "
            f"{vector['identical_answers']}/{vector['questions']} identical answers in the two modes.\n"
            f"- `bench.reliability`: {c['offered']} sessions, {c['answered']} answered, {c['failed']} failed, "
            f"{c.get('lost', MISSING)} lost, {c['disconnected']} disconnected on purpose.")


def vs_vllm_serve(data: dict) -> str:
    """Our OpenAI routes / plain `vllm serve` per (route, rate): ratios, ours and vLLM's median TTFT and
    TPOT (vLLM: mean of its two phases), then the worst ratios against their targets."""
    rows = []
    for c in data["cells"]:
        r, ours = c["ratios"], c["ours"]
        vllm = {k: (c["vllm_first"][k] + c["vllm_second"][k]) / 2 for k in ("median_ttft_ms", "median_tpot_ms")}
        rows.append([c["route"], num(c["request_rate"]), f"{ms(ours['median_ttft_ms'])} / {ms(vllm['median_ttft_ms'])}",
                     num(r["ttft_p50_ratio"]), num(r["ttft_p99_ratio"]),
                     f"{ms(ours['median_tpot_ms'])} / {ms(vllm['median_tpot_ms'])}", num(r["tpot_p50_ratio"]),
                     num(r["throughput_ratio"]), num(r["vllm_drift"])])
    s = data["summary"]
    worst = ", ".join(f"{k} {num(v)}" + (f" (target {s['targets'][k]}: {'met' if s['met'][k] else 'MISSED'})"
                                         if k in s["targets"] else "") for k, v in s["worst"].items())
    parts = [table(["route", "req/s", "TTFT p50 ours / vLLM", "TTFT p50 ratio", "TTFT p99 ratio",
                    "TPOT p50 ours / vLLM", "TPOT p50 ratio", "throughput ratio", "vLLM drift"], rows), "",
             f"Worst over cells: {worst}; failed requests {s['failed_requests']}."]
    if "cpu_by_process" in data:
        parts += ["", _cpu_by_process(data["cpu_by_process"])]
    return "\n".join(parts)


def _cpu_by_process(phases: dict, top: int = 8) -> str:
    """CPU seconds per process role in each phase's measured runs: a row per phase, a column per role
    (the `top` roles by their largest figure; the others summed)."""
    names = list(phases)
    roles = sorted({r for p in phases.values() for r in p["cpu_s"]},
                   key=lambda r: -max(p["cpu_s"].get(r, 0.0) for p in phases.values()))
    shown = roles[:top]
    rows = []
    for name in names:
        cpu = phases[name]["cpu_s"]
        rest = sum(v for r, v in cpu.items() if r not in shown)
        rows.append([name, num(phases[name]["wall_s"]), *(num(cpu.get(r, 0.0)) for r in shown), num(rest),
                     num(sum(cpu.values()))])
    return ("CPU seconds per process role over each phase's measured runs (`bench.process_cpu`: every "
            "process on the machine):\n\n" + table(["phase", "wall s", *(f"`{r}`" for r in shown), "the rest", "all"], rows))
