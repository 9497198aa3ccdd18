"""Serving metrics named as `vllm bench serve` names them, from per-request timing records (pure).

    records = [RequestRecord(sent_s=0.0, first_token_s=0.4, end_s=1.2, output_tokens=17), ...]
    metrics = serving_metrics(records, duration_s=30.0, slo_ttft_ms=500)
    metrics["median_ttft_ms"], metrics["p99_tpot_ms"], metrics["request_goodput"]

Definitions follow vLLM's `benchmark_serving`:
- TTFT: first token minus `ttft_start_s` (default: the send time). RAG benches pass the moment the
  last context piece was in (`retrieval_done`), the paper's TTFT; the record says which.
- TPOT: (end - first token) / (output tokens - 1), per request with more than one output token.
- ITL: the gaps between consecutive streamed token events, pooled over all requests (an SSE event
  may carry several tokens, as a streamed chunk does in vLLM's client). Reported only when records
  carry `token_times`; otherwise the ITL keys are None, never estimated.
- E2EL: end minus send.
- Percentiles (and the median): `bench.stats.percentile`, linear interpolation, as vLLM's `np.percentile`.
- `request_goodput`: completed requests that met every SLO given, per second of `duration_s`
  (vLLM's `--goodput`); with no SLO it is None.
Times are seconds on one clock (time.monotonic()); the metrics are milliseconds, as vLLM's.
Failed requests (ok=False) count in `failed` and in no latency figure.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from bench.stats import percentile

PERCENTILES = (50, 95, 99)
METRICS = ("ttft", "tpot", "itl", "e2el")


class MetricsError(ValueError):
    """Records or parameters that no metric can be computed from."""


@dataclass(frozen=True)
class RequestRecord:
    sent_s: float
    first_token_s: float | None = None
    end_s: float | None = None
    output_tokens: int | None = None
    token_times: tuple[float, ...] = ()  # arrival of each streamed token event, when recorded
    ok: bool = True
    ttft_start_s: float | None = None  # what TTFT is measured from (default: sent_s)

    def ttft_ms(self) -> float | None:
        if self.first_token_s is None:
            return None
        start = self.sent_s if self.ttft_start_s is None else self.ttft_start_s
        return (self.first_token_s - start) * 1e3

    def tpot_ms(self) -> float | None:
        if self.first_token_s is None or self.end_s is None or not self.output_tokens or self.output_tokens < 2:
            return None
        return (self.end_s - self.first_token_s) / (self.output_tokens - 1) * 1e3

    def itl_ms(self) -> list[float]:
        times = self.token_times
        return [(b - a) * 1e3 for a, b in zip(times, times[1:])]

    def e2el_ms(self) -> float | None:
        return None if self.end_s is None else (self.end_s - self.sent_s) * 1e3


def record_from_summary(summary: dict, *, sent_key: str = "sent_s") -> RequestRecord:
    """A record from a bench request summary holding relative seconds: `sent_s`, `latency_s`,
    optional `first_token_s`/`retrieval_done_s`/`token_times_s`/`output_tokens`, and `ok`."""
    sent = summary[sent_key]
    latency = summary.get("latency_s")
    rel = summary.get("token_times_s") or ()
    return RequestRecord(sent_s=sent, first_token_s=_plus(sent, summary.get("first_token_s")),
                         end_s=_plus(sent, latency), output_tokens=summary.get("output_tokens"),
                         token_times=tuple(sent + t for t in rel), ok=bool(summary.get("ok")),
                         ttft_start_s=_plus(sent, summary.get("retrieval_done_s")))


def record_from_rag(result) -> RequestRecord:
    """A record from a `pipeline.run.rag_client.RagResult` (read by attribute; nothing imported): TTFT
    from `retrieval_done` (the paper's), output tokens from the final event."""
    return RequestRecord(sent_s=result.sent_at, first_token_s=result.first_token_at, end_s=result.done_at,
                         output_tokens=result.final.get("output_tokens"), token_times=tuple(result.token_times),
                         ok=result.ok, ttft_start_s=result.retrieval_done_at)


def _plus(base: float, offset: float | None) -> float | None:
    return None if offset is None else base + offset


def summary_stats(name: str, values_ms: Sequence[float], percentiles: Iterable[int] = PERCENTILES) -> dict:
    """`mean_<name>_ms`, `median_<name>_ms`, `std_<name>_ms` and `p<q>_<name>_ms` (None when empty)."""
    values = np.asarray([v for v in values_ms if v is not None], dtype=float)
    empty = values.size == 0
    out = {f"mean_{name}_ms": None if empty else float(values.mean()),
           f"median_{name}_ms": percentile(values, 50),
           f"std_{name}_ms": None if empty else float(values.std())}
    for q in percentiles:
        out[f"p{q:g}_{name}_ms"] = percentile(values, q)
    return out


def meets_slos(record: RequestRecord, slos_ms: dict[str, float]) -> bool:
    """A completed request whose every SLO'd metric (ttft, tpot, e2el) is known and within bound."""
    if not record.ok:
        return False
    for metric, bound in slos_ms.items():
        value = getattr(record, f"{metric}_ms")()
        if metric == "tpot" and value is None and record.output_tokens == 1:
            continue  # one output token has no time per output token: nothing to violate
        if value is None or value > bound:
            return False
    return True


def serving_metrics(records: Sequence[RequestRecord], duration_s: float, *, slo_ttft_ms: float | None = None,
                    slos_ms: dict[str, float] | None = None,
                    percentiles: Iterable[int] = PERCENTILES) -> dict:
    """The `vllm bench serve` result keys over `records`, a run that took `duration_s`."""
    if duration_s <= 0:
        raise MetricsError(f"duration_s must be > 0, got {duration_s}")
    slos = dict(slos_ms or {})
    if slo_ttft_ms is not None:
        slos["ttft"] = slo_ttft_ms
    unknown = set(slos) - {"ttft", "tpot", "e2el"}
    if unknown or any(v <= 0 for v in slos.values()):
        raise MetricsError(f"SLOs are positive milliseconds for ttft, tpot or e2el, got {slos}")
    percentiles = tuple(percentiles)
    done = [r for r in records if r.ok]
    out_tokens = sum(r.output_tokens or 0 for r in done)
    has_itl = any(len(r.token_times) > 1 for r in done)
    out = {"completed": len(done), "failed": len(records) - len(done), "duration": duration_s,
           "total_output_tokens": out_tokens, "request_throughput": len(done) / duration_s,
           "output_throughput": out_tokens / duration_s}
    out |= summary_stats("ttft", [r.ttft_ms() for r in done], percentiles)
    out |= summary_stats("tpot", [r.tpot_ms() for r in done], percentiles)
    out |= summary_stats("itl", [v for r in done for v in r.itl_ms()] if has_itl else [], percentiles)
    out |= summary_stats("e2el", [r.e2el_ms() for r in done], percentiles)
    good = sum(meets_slos(r, slos) for r in done) if slos else None
    out["request_goodput"] = None if good is None else good / duration_s
    out["goodput_slos_ms"] = slos or None
    out["itl_measured"] = has_itl
    return out


def add_slo_arguments(parser: argparse.ArgumentParser) -> None:
    """`--slo-ttft` (and `--slo-tpot`, `--slo-e2el`) in milliseconds, as vLLM's `--goodput` takes them."""
    parser.add_argument("--slo-ttft", type=float, default=None, metavar="MS",
                        help="TTFT SLO (ms) for request_goodput")
    parser.add_argument("--slo-tpot", type=float, default=None, metavar="MS", help="TPOT SLO (ms)")
    parser.add_argument("--slo-e2el", type=float, default=None, metavar="MS", help="end-to-end latency SLO (ms)")


def slos_from_args(args) -> dict[str, float]:
    slos = {m: getattr(args, f"slo_{m}", None) for m in ("ttft", "tpot", "e2el")}
    return {m: v for m, v in slos.items() if v is not None}
