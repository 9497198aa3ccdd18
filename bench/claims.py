"""The claims the benchmarks make, in one table: claim, figure, target, met or missed, the machine's
CPU and the engine dtype, the sample size and the results file. `docs/BENCHMARKS.md` opens with it
(block `claims`, rendered and checked like every other table by `bench.render_docs`).

A claim is one registry entry: where its figure sits in a results file (`at("summary", "key")` or
any function of the file's JSON), its target (`Target("<=", 1.3)`; the bound may itself be read
from the file, as `at("throughput_target")`), and how many samples stand behind it. A figure with
no target yet (`target=None`) is shown as such. Add a benchmark's claim by appending to `CLAIMS`.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from functools import reduce

from bench.doc_tables import MISSING, num, table
from bench.doc_tables import provenance as doc_provenance
from bench.results_meta import META_KEY

Getter = Callable[[dict], object]
OPS = {"<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt, "==": operator.eq}


def at(*path: str) -> Getter:
    """The value at `path` (keys of nested dicts) of a results file."""
    return lambda data: reduce(operator.getitem, path, data)


@dataclass(frozen=True)
class Target:
    op: str                      # one of OPS
    bound: float | bool | Getter  # a value, or where the results file records it

    def __post_init__(self):
        if self.op not in OPS:
            raise ValueError(f"target operator {self.op!r}; known: {', '.join(OPS)}")

    def value(self, data: dict):
        return self.bound(data) if callable(self.bound) else self.bound

    def met(self, figure, data: dict) -> bool | None:
        return None if figure is None else bool(OPS[self.op](figure, self.value(data)))


@dataclass(frozen=True)
class Claim:
    text: str                # what is claimed, in words
    results: str             # the results file, under bench/results/
    figure: Getter           # the figure, from that file's JSON
    target: Target | None    # None: a headline figure without a target
    n: Callable[[dict], str]  # the samples behind the figure, in words


def _sessions(data: dict) -> str:
    return f"{len(data['sessions'])} sessions"


def _offered(data: dict) -> str:
    return f"{data['counts']['offered']} sessions"


def _per_mode(data: dict) -> str:
    return f"{data['sessions']} sessions per mode"


def _p99_ratio(data: dict) -> float:
    return data["stream"]["ttft_p99_s"] / data["oneshot"]["ttft_p99_s"]


def _tailguard_runs(data: dict) -> list[bool]:
    return [v["p99_at_most_oneshot"] for w in data["workloads"].values()
            for v in w.get("tailguard_vs_oneshot", {}).values()]


def _plugin_worst_at_500(data: dict) -> float:
    return max(per["500"] for per in data["plugin_us_per_step"].values())


def _plugin_contended_worst_at_500(data: dict) -> float:
    return max(per["500"] for per in data["plugin_contended_us_per_step"].values())


def _admission_n(data: dict) -> str:
    return " and ".join(f"{run['replicas']} replica{'s' if run['replicas'] > 1 else ''}" for run in data["runs"])


def _engine_load_n(data: dict) -> str:
    return f"{data['sessions']} sessions x {len(data[META_KEY]['seeds'])} seeds x {len(data['qps'])} QPS"


def _sim_vs_engine(data: dict) -> dict:
    return data["workloads"]["crawler"]["engine"]["sim_vs_engine"]


def _engine_runs(data: dict) -> int:
    return sum(len(per) for per in data["workloads"]["crawler"]["engine"]["results"].values())


def _cluster_n(data: dict) -> str:
    return f"{len(data['cells'])} cells, {data['sessions_per_cell']} sessions each"


def _central_vs_pow2_median(data: dict) -> float:
    ratios = sorted(c["routers"]["central"]["ttft_p99_s"] / c["routers"]["pow2"]["ttft_p99_s"]
                    for c in data["cells"].values())
    return ratios[len(ratios) // 2]


CLAIMS: tuple[Claim, ...] = (
    Claim("engine: streamed TTFT P50 / floor (only the last chunk left), 0.7 s gaps", "engine_ttft.json",
          at("floor_ratio_p50"), Target("<=", 1.3), _sessions),
    Claim("engine: streamed TTFT P50 / floor, 4 s gaps (the engine keeps up)", "engine_ttft_long_gap.json",
          at("floor_ratio_p50"), Target("<=", 1.3), _sessions),
    Claim("engine: one-shot / streamed TTFT P50, 4 s gaps", "engine_ttft_long_gap.json",
          at("speedup_p50"), None, _sessions),
    Claim("engine: the CPU default dtype is the faster one", "cpu_dtype.json",
          at("default_is_fastest"), Target("==", True), lambda d: f"{len(d['dtypes']['float32']['ttft_s'])} runs per dtype"),
    Claim("HTTP pipeline, closed loop: answered sessions/s streamed / one-shot", "pipeline.json",
          at("throughput_ratio"), Target(">=", at("throughput_target")), _per_mode),
    Claim("HTTP pipeline, open loop QPS 0.15: one-shot / streamed TTFT P50", "pipeline_qps0.15.json",
          at("speedup_p50"), Target(">=", 1.0), _per_mode),
    Claim("HTTP pipeline, open loop QPS 0.15: streamed / one-shot TTFT P99", "pipeline_qps0.15.json",
          _p99_ratio, Target("<=", 1.0), _per_mode),
    Claim("engine under load: worst streamed / one-shot TTFT (P50, P95, P99 per QPS; median over seeds)",
          "engine_load.json", at("summary", "stream_vs_oneshot_worst_ratio"), Target("<=", 1.0), _engine_load_n),
    Claim("engine under load: one-shot / streamed TTFT P50 at the lightest load", "engine_load.json",
          at("summary", "light_load_speedup_p50"), Target(">=", 3.0), _engine_load_n),
    Claim("engine under load: TailGuard has the lowest P99 at the top loads", "engine_load.json",
          at("summary", "tailguard_lowest_p99"), Target("==", True), _engine_load_n),
    Claim("simulator at paper scale: (scenario, seed) runs where TailGuard's P99 <= one-shot's", "policies.json",
          lambda d: sum(_tailguard_runs(d)), Target("==", lambda d: len(_tailguard_runs(d))),
          lambda d: f"{len(_tailguard_runs(d))} runs"),
    Claim("simulator vs real engine: median relative error of TTFT P50 and P95", "policies.json",
          lambda d: _sim_vs_engine(d)["median_abs_rel_error_p50_p95"],
          Target("<=", lambda d: _sim_vs_engine(d)["tolerance_rel"]),
          lambda d: f"{d['workloads']['crawler']['engine']['sessions']} sessions x {_engine_runs(d)} runs"),
    Claim("vLLM plug-in step at 500 sessions, slowest policy (µs)", "scheduler_overhead.json",
          _plugin_worst_at_500, Target("<=", at("plugin_target_us_at_500")),
          lambda d: f"best of {d['plugin_repeats']} seeds"),
    Claim("vLLM plug-in step at 500 sessions with the queues sorted, slowest policy (µs)", "scheduler_overhead.json",
          _plugin_contended_worst_at_500, Target("<=", at("plugin_target_us_at_500")),
          lambda d: f"best of {d['plugin_repeats']} seeds"),
    Claim("OpenAI routes vs plain `vllm serve`: TTFT P50 ours / theirs, worst cell", "vs_vllm_serve.json",
          at("summary", "worst", "ttft_p50_ratio"), Target("<=", 1.10), lambda d: f"{len(d['cells'])} cells, A-B-A"),
    Claim("OpenAI routes vs plain `vllm serve`: throughput ours / theirs, worst cell", "vs_vllm_serve.json",
          at("summary", "worst", "throughput_ratio"), Target(">=", 0.95), lambda d: f"{len(d['cells'])} cells, A-B-A"),
    Claim("Ray's autoscaler (fake_multinode): worker nodes launched under load with a replica on them",
          "cluster_launch.json", lambda d: min(d["nodes_launched"], d["replicas_on_new_node"]), Target(">=", 1),
          lambda d: f"{d['sessions']} sessions"),
    Claim("Ray's autoscaler (fake_multinode): sessions lost through scale-up and scale-down", "cluster_launch.json",
          at("lost"), Target("==", 0), lambda d: f"{d['sessions']} sessions"),
    Claim("Ray's autoscaler (fake_multinode): open sessions replayed from scratch through the scale-down",
          "cluster_launch.json", at("moves", "replayed"), Target("==", 0),
          lambda d: f"{d['moves']['moved']} moved by the stopping replica"),
    Claim("admission: projected vs final KV of a replica's sessions, error P50 (fraction of capacity)", "admission_accuracy.json",
          at("projection_abs_error_p50"), Target("<=", at("targets", "projection_abs_error_p50")), _admission_n),
    Claim("admission: projected vs final KV of a replica's sessions, error P95 (fraction of capacity)", "admission_accuracy.json",
          at("projection_abs_error_p95"), Target("<=", at("targets", "projection_abs_error_p95")), _admission_n),
    Claim("admission: real KV use at the first 429", "admission_accuracy.json",
          at("real_kv_frac_at_first_429"), Target(">=", at("targets", "real_kv_frac_at_first_429")), _admission_n),
    Claim("central scheduler: admissions/s, saturating", "central.json",
          at("saturated", "admits_per_s"), Target(">=", at("targets", "admits_per_s")),
          lambda d: f"median of {d['saturated']['repeats']} runs"),
    Claim("central scheduler: admission P99 (ms) at the target rate", "central.json",
          at("at_target_rate", "admit_p99_ms"), Target("<", at("targets", "admit_p99_ms")),
          lambda d: f"median of {d['at_target_rate']['repeats']} runs"),
    Claim("cluster simulation: central / Ray Serve pow2 P99 TTFT at 64 replicas and 80% load, worst cell",
          "cluster_sim.json", at("central_vs_pow2_p99_ratio_64_at_80"),
          Target("<=", at("targets", "central_vs_pow2_p99_ratio_64_at_80")), _cluster_n),
    Claim("cluster simulation: central / Ray Serve pow2 P99 TTFT, median over all cells", "cluster_sim.json",
          _central_vs_pow2_median, None, _cluster_n),
    Claim("grounded QA (vector): streamed answers identical to one-shot", "qa.json",
          lambda d: d["sources"]["vector"]["identical_answers"] / d["sources"]["vector"]["questions"],
          Target("==", 1.0), lambda d: f"{d['sources']['vector']['questions']} questions"),
    Claim("reliability drill (kills, disconnects): accepted sessions lost", "reliability.json",
          at("counts", "lost"), Target("==", 0), lambda d: f"{d['counts']['offered']} sessions"),
    Claim("reliability at scale (five faults in one run): sessions lost (no final event, or asked again where a "
          "resume was possible)", "reliability_scale.json", at("counts", "lost"), Target("==", 0), _offered),
    Claim("reliability at scale: sessions whose user had to ask again", "reliability_scale.json", at("reasked"),
          Target("==", 0), _offered),
    Claim("reliability at scale: KV blocks back to the idle level after the load", "reliability_scale.json",
          at("kv_baseline_vs_after", "back_to_baseline"), Target("==", True), _offered),
    Claim("locust soak: failed requests", "soak.json", at("failures"), Target("==", 0),
          lambda d: f"{d['requests']:,} requests"),
)


def files() -> tuple[str, ...]:
    """The results files the claims read, each once, in first-use order."""
    return tuple(dict.fromkeys(c.results for c in CLAIMS))


def machine(data: dict) -> str:
    """`CPU model (bf16 or no bf16), dtype`, as far as the file records them."""
    meta = data.get(META_KEY) or {}
    m = meta.get("machine") or {}
    cpu = m.get("cpu_model") or "CPU not recorded"
    if m.get("cpu_bf16") is not None:
        cpu += " (bf16)" if m["cpu_bf16"] else " (no bf16)"
    if m.get("gpus"):
        cpu += f", {len(m['gpus'])} x {m['gpus'][0]}"
    dtype = meta.get("dtype")
    return f"{cpu}, {dtype}" if dtype and "n/a" not in str(dtype) else cpu


def row(claim: Claim, data: dict) -> list[str]:
    figure = claim.figure(data)
    if claim.target is None:
        target, verdict = "none", "no target"
    else:
        met = claim.target.met(figure, data)
        target = f"{claim.target.op} {num(claim.target.value(data))}"
        verdict = MISSING if met is None else "met" if met else "**missed**"
    return [claim.text, num(figure), target, verdict, machine(data), claim.n(data), f"`{claim.results}`"]


def render(*datas: dict) -> str:
    """The claims table; `datas`: the JSON of each of `files()`, in that order."""
    by_file = dict(zip(files(), datas))
    return table(["claim", "figure", "target", "verdict", "CPU, dtype", "n", "results"],
                 [row(c, by_file[c.results]) for c in CLAIMS])


def provenance(datas: dict[str, dict], shown_elsewhere: set[str]) -> str:
    """The block's provenance: each row names its file (`datas`: file -> its JSON); a file with a table
    of its own (`shown_elsewhere`) has its run under that table, the others get their line here."""
    line = (f"Results: `bench/results/` ({len(datas)} files, one per row as named); each file's commit, "
            "date, machine and seeds are under its benchmark's table (here or in docs/BENCHMARKS_COMPONENTS.md)")
    own = [f"- {doc_provenance(name, data)}" for name, data in datas.items() if name not in shown_elsewhere]
    return line + (", or here for the files without one:\n\n" + "\n".join(own) if own else ".")
