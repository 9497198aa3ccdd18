"""The summary of a `bench.reliability` run: outcomes, what each fault hit and what became of it,
why each session asked again, memory, replicas, KV and the serving metrics.

A session counts as `reasked` when its user had to send the question again (`must_ask_again`);
`reask_reasons` says why per case. It counts as lost, besides the sessions that never got a final
event, when it was asked again although the system held what a resume needed (`resumable_reasks`):
`lost` = sessions with no final event + resumable reasks.
"""

from __future__ import annotations

from collections import Counter

from bench.serving_metrics import record_from_summary, serving_metrics
from bench.stats import percentile
from pipeline.sessions.store import shard_index

# why a session was asked again (the first attempt's `cut_error`), and whether a resume was possible
UNRESUMABLE = {"no_event": "cut before the first event: the client holds no id to resume with",
               "answer_and_replica_lost": "SessionGone: the replica holding the session died as well as "
                                          "the ingress driving it (a double fault): nothing held it"}


def reask_reason(record: dict) -> str:
    """`no_event`, `answer_and_replica_lost`, or `resumable` (a resume was possible: counted lost)."""
    error = record.get("cut_error") or ""
    if error.startswith("SessionGone"):
        return "answer_and_replica_lost"
    if not record.get("cut_had_id"):
        return "no_event"
    return "resumable"


def _stats(values) -> dict:
    values = [v for v in values if v is not None]
    return {"p50": percentile(values, 50), "p95": percentile(values, 95), "max": max(values, default=None)}


def _changes(samples: list[dict], key: str) -> list[tuple[float, int]]:
    """(t_s, value) whenever `key` changes: a compact timeline."""
    out: list[tuple[float, int]] = []
    for s in samples:
        if s.get(key) is not None and (not out or out[-1][1] != s[key]):
            out.append((s["t_s"], s[key]))
    return out


def _in_flight(record: dict, at_s: float) -> bool:
    done = record["sent_s"] + (record["latency_s"] or 0.0)
    return record["sent_s"] <= at_s <= done


def affected(fault: dict, records: list[dict]) -> list[dict]:
    """The sessions a fault hit: on the replica (or node) that went, carried by the ingress that went,
    whose record the killed shard held, or (central restart) every session open at that moment."""
    kind, at = fault.get("fault"), fault.get("at_s")
    if not fault.get("fired", fault.get("killed")) or at is None:
        return []
    if kind in ("replica_kill", "node_removal"):
        hit = set(fault.get("sessions", ()))
        return [r for r in records if hit & set(r["session_ids"])]
    if kind == "ingress_kill":
        return [r for r in records if fault["replica_id"] in r["ingresses"] and _in_flight(r, at)]
    if kind == "shard_kill":
        return [r for r in records if r["kind"] == "streams" and _in_flight(r, at) and any(
            shard_index(s, fault["shards"]) == fault["shard_index"] for s in r["session_ids"])]
    return [r for r in records if _in_flight(r, at)]  # central_restart


def fault_outcome(fault: dict, records: list[dict]) -> dict:
    hit = affected(fault, records)
    return {**fault, "affected": {
        "sessions": len(hit), "indices": [r["index"] for r in hit],
        "outcomes": dict(Counter(r["outcome"] for r in hit)), "recovered": sum(r["recovered"] for r in hit),
        "resumed": sum(r["resumed"] > 0 for r in hit), "took_over": sum(r.get("took_over", 0) > 0 for r in hit),
        "reasked": sum(r["reasked"] for r in hit)}}


def _ingress_kill_outcome(kill: dict, records: list[dict]) -> dict:
    """The drill's record with what became of the sessions whose stream the killed ingress carried."""
    if not kill.get("killed"):
        return kill
    cut = [r for r in records if r["resumed"] or r["reasked"] or r.get("took_over")]
    on_victim = [r for r in cut if kill["replica_id"] in r["ingresses"]]
    refused = [r for r in cut if r["reasked"] and r["ingresses"][:1] == [""]]  # no ingress id: the proxy's 5xx
    return {**kill, "sessions_cut": len(cut), "cut_on_the_killed_ingress": len(on_victim),
            "refused_by_proxy": len(refused), "cut_outcomes": dict(Counter(r["outcome"] for r in cut))}


def _counts(records: list[dict], plans, resumable: int) -> dict:
    by = Counter(r["outcome"] for r in records)
    return {"offered": len(records),
            **{k: by.get(k, 0) for k in ("answered", "rejected", "failed", "disconnected")},
            "lost": by.get("lost", 0) + resumable,
            "no_final_event": by.get("lost", 0), "reasked_resumable": resumable,
            "disconnected_mid_retrieval": sum(r["outcome"] == "disconnected" and r["leave_on"] == "context"
                                              for r in records),
            "disconnected_mid_answer": sum(r["outcome"] == "disconnected" and r["leave_on"] == "token"
                                           for r in records),
            "by_source": {k: dict(Counter(r["outcome"] for r in records if r["kind"] == k))
                          for k in sorted({p.kind for p in plans})}}


def summarize(raw: dict, plans) -> dict:
    records, memory, series = raw["records"], raw["memory"], raw["series"]
    reasks = [{"index": r["index"], "kind": r["kind"], "reason": reask_reason(r), "cut_error": r["cut_error"]}
              for r in records if r["reasked"]]
    resumable = sum(x["reason"] == "resumable" for x in reasks)
    mem = [m["ray_rss_mb"] for m in memory]
    workers = [m["worker_rss_mb"] for m in memory]
    answered = [r for r in records if r["outcome"] == "answered"]
    faults = [fault_outcome(f, records) for f in raw["faults"]]
    return {
        "counts": _counts(records, plans, resumable),
        "recovered": sum(r["recovered"] for r in answered),
        "resumed": sum(r["resumed"] > 0 for r in records),  # cut, reconnected with Last-Event-ID
        "took_over": sum(r.get("took_over", 0) > 0 for r in records),  # cut mid-retrieval, resumed there
        "retried_unstarted": sum(r.get("retried", 0) > 0 for r in records),  # sent again: no ingress had it
        "reasked": len(reasks),
        "reask_reasons": {"counts": dict(Counter(x["reason"] for x in reasks)),
                          "why": {k: v for k, v in UNRESUMABLE.items() if any(x["reason"] == k for x in reasks)},
                          "cases": reasks},
        "faults": faults,
        "kill": next((f for f in faults if f.get("fault") == "replica_kill"), {"killed": False}),
        "ingress_kill": _ingress_kill_outcome(
            next((f for f in faults if f.get("fault") == "ingress_kill"), {"killed": False}), records),
        "leaks": raw["drain"],
        "kv_baseline_vs_after": {"baseline_blocks": raw["idle"]["kv_blocks_used"],
                                 "after_blocks": raw["drain"].get("kv_blocks_used"),
                                 "back_to_baseline": bool(raw["drain"].get("drained"))},
        "memory_mb": {"ray_start": mem[0] if mem else None, "ray_peak": max(mem, default=None),
                      "ray_final": mem[-1] if mem else None, "workers_start": workers[0] if workers else None,
                      "workers_peak": max(workers, default=None), "workers_final": workers[-1] if workers else None},
        "replicas": {"running_max": max((m["running_replicas"] or 0 for m in memory), default=None),
                     "running_final": memory[-1]["running_replicas"] if memory else None,
                     "running_timeline": _changes(memory, "running_replicas"),
                     "reporting_timeline": _changes(series, "replicas")},
        "kv": {"blocks_total_max": max((s["kv_blocks_total"] for s in series), default=None),
               "blocks_used_peak": max((s["kv_blocks_used"] for s in series), default=None),
               "sessions_peak": max((s["sessions"] for s in series), default=None),
               "queued_peak": max((s["queued"] for s in series), default=None), "idle": raw["idle"]},
        "latency_s": _stats(r["latency_s"] for r in answered), "ttft_s": _stats(r["ttft_s"] for r in answered),
        # sessions left on purpose are neither completed nor failed: not in the serving metrics
        "serving": serving_metrics([record_from_summary(r) for r in records if r["outcome"] != "disconnected"],
                                   max(raw["load_s"], 1e-9), slos_ms=raw.get("slos_ms")),
        "load_s": raw["load_s"],
        "failures": [r for r in records if r["outcome"] in ("failed", "lost")],
        "records": records, "cluster_series": series, "memory_series": memory,
    }
