"""Microseconds per scheduling decision, per policy, at 100 / 500 / 2,000 queued requests.

    python -m bench.scheduler_overhead  ->  bench/results/scheduler_overhead.json

A step changes a few requests (64 here: decodes advancing, chunks arriving, admissions) and then
needs the policy's order. `us_per_step` is that ordering cost with the incremental PolicyQueue
(re-key the changed requests, produce the ordered list): the figure the paper measured (~150 us
at 500 requests, ~17 us for default vLLM). `full_sort_us_per_step` re-sorts everything each step;
`plan_us_per_step` is the whole two-phase decision (ordering + phase 1 walk + phase 2 allocation).
`plugin_us_per_step` is the vLLM plug-in's own step code (`StreamingScheduler.plan_and_apply`:
re-read changed views, plan, evict, order vLLM's queues) on a real vLLM scheduler and real
`Request` objects (no model: `engine.offline_scheduler`), with N open streaming sessions of which
PLUGIN_CHUNKS_PER_STEP get a new chunk each step. With the default token budget the step's new
chunks all fit it, so vLLM schedules them whole in any order and the plug-in skips the sort;
`plugin_contended_us_per_step` is the same with a budget of PLUGIN_CONTENDED_BUDGET tokens, less
than the chunks' work, where the order decides (the sort runs). Both have the same target, <= 50 us
at 500 sessions (`plugin_meets_target`, `plugin_contended_meets_target`); the planner's own path
(blocks short: it files and walks every request) is `plan_us_per_step`, without a target.
Each figure is the best of REPEATS runs (different seeds): on a shared machine the minimum is the
cost of the code, the rest is other processes' noise.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

from bench.results_meta import start_run, write_results
from scheduler.blocks import CountingBlockManager
from scheduler.planner import StepBudget, plan_step
from scheduler.policies import POLICIES, make_policy
from scheduler.queue import PolicyQueue
from scheduler.request import RequestView

RESULTS = Path(__file__).parent / "results" / "scheduler_overhead.json"
SIZES = (100, 500, 2000)
CHANGED_PER_STEP = 64
STEPS = 300
REPEATS = 5


def make_views(n: int, rng: random.Random) -> list[RequestView]:
    views = []
    for seq in range(n):
        first = rng.uniform(0, 100)
        kind = rng.random()
        prompt = rng.randint(500, 9000)
        v = RequestView(f"r{seq}", seq, first, first + rng.uniform(0, 50), prompt,
                        complete=kind < 0.3, max_output_tokens=128)
        if kind < 0.8:  # resident: decoding (complete) or idle partial stream
            v.num_computed_tokens = prompt
            v.num_output_tokens = 1 if v.complete else 0
            v.num_kv_blocks, v.running, v.admitted_seq = -(-prompt // 16), True, seq
            v.chunk_gaps.extend(rng.uniform(1, 20) for _ in range(rng.randint(0, 4)))
        views.append(v)
    return views


def mutate(v: RequestView, rng: random.Random, now: float) -> None:
    if v.complete and v.running:
        v.num_computed_tokens += 1
        v.num_output_tokens += 1
    else:
        v.record_chunk(now)
        v.num_prompt_tokens += rng.randint(100, 1500)


def measure(name: str, n: int) -> dict:
    runs = [measure_once(name, n, seed) for seed in range(REPEATS)]
    return {key: min(run[key] for run in runs) for key in runs[0]}


def measure_once(name: str, n: int, seed: int) -> dict:
    rng, policy = random.Random(n * 1000 + seed), make_policy(name)
    views = make_views(n, rng)
    queue = PolicyQueue(policy)
    for v in views:
        queue.touch(v)
    changed = [rng.sample(views, min(CHANGED_PER_STEP, n)) for _ in range(STEPS)]
    spent = 0.0
    for step, batch in enumerate(changed):
        for v in batch:
            mutate(v, rng, 200.0 + step)  # the engine's own bookkeeping: not timed
        t0 = time.perf_counter()
        for v in batch:
            queue.touch(v)
        queue.ordered()
        spent += time.perf_counter() - t0
    incremental = spent / STEPS
    t0 = time.perf_counter()
    for _ in range(STEPS):
        policy.order(views)
    full = (time.perf_counter() - t0) / STEPS
    budget = StepBudget(8192, 16)
    t0 = time.perf_counter()
    for _ in range(STEPS // 3):
        plan_step(queue.ordered(), CountingBlockManager(10**9), budget)
    plan = (time.perf_counter() - t0) / (STEPS // 3)
    return {"us_per_step": incremental * 1e6, "full_sort_us_per_step": full * 1e6,
            "plan_us_per_step": plan * 1e6}


PLUGIN_CHUNKS_PER_STEP = 32
PLUGIN_STEPS = 40
PLUGIN_TARGET_US_AT_500 = 50.0
PLUGIN_BUDGET = 8192
PLUGIN_CONTENDED_BUDGET = 960  # 30 of the step's 32 new chunks of 32 tokens: the order decides


def measure_plugin(name: str, n: int, seed: int, budget: int = PLUGIN_BUDGET) -> float:
    """Mean microseconds of the plug-in's step code per engine step (see module doc)."""
    from engine.offline_scheduler import Driver, make_scheduler
    from engine.vllm_scheduler import StreamingScheduler

    rng = random.Random(seed)
    sched = make_scheduler(StreamingScheduler, name, num_blocks=n * 10 + 64, max_num_seqs=256, budget=budget)
    driver = Driver(sched)
    sessions = [f"s{i}" for i in range(n)]
    for rid in sessions:
        driver.turn(rid, 64)
    driver.run_until(lambda: len(sched.parked) == n, max_steps=10 * n)
    real, spent = sched.plan_and_apply, [0.0]

    def timed() -> None:
        t0 = time.perf_counter()
        real()
        spent[0] += time.perf_counter() - t0

    sched.plan_and_apply = timed
    for _ in range(PLUGIN_STEPS):
        for rid in rng.sample(sessions, PLUGIN_CHUNKS_PER_STEP):
            if rid in sched.parked:
                driver.turn(rid, 32)
        driver.step()
    return spent[0] / PLUGIN_STEPS * 1e6


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    meta = start_run(model=None, dtype=None, seeds=list(range(REPEATS)))
    report = {"changed_per_step": CHANGED_PER_STEP, "steps": STEPS, "repeats": REPEATS,
              "statistic": "min over repeats", "policies": {}}
    print(f"{'policy':13s} {'n':>5s} {'us/step':>9s} {'full sort':>10s} {'plan':>9s}")
    for name in POLICIES:
        for n in SIZES:
            row = measure(name, n)
            report["policies"].setdefault(name, {})[str(n)] = row
            print(f"{name:13s} {n:5d} {row['us_per_step']:9.1f} {row['full_sort_us_per_step']:10.1f} "
                  f"{row['plan_us_per_step']:9.1f}")
    report["us_per_step"] = {name: {n: rows[n]["us_per_step"] for n in rows}
                             for name, rows in report["policies"].items()}
    report["plugin_us_per_step"] = {name: {str(n): min(measure_plugin(name, n, seed) for seed in range(REPEATS))
                                           for n in SIZES} for name in POLICIES}
    report["plugin_contended_us_per_step"] = {
        name: {str(n): min(measure_plugin(name, n, seed, PLUGIN_CONTENDED_BUDGET) for seed in range(REPEATS))
               for n in SIZES} for name in POLICIES}
    report["plugin_budgets"] = {"plugin_us_per_step": PLUGIN_BUDGET,
                                "plugin_contended_us_per_step": PLUGIN_CONTENDED_BUDGET}
    for key in ("plugin_us_per_step", "plugin_contended_us_per_step"):
        for name, rows in report[key].items():
            print(f"{key} {name:13s} " + " ".join(f"{n}: {us:8.1f} us" for n, us in rows.items()))
    # Machines differ (and a shared one's load with them): the sorted step over the unsorted one,
    # both measured in this run, compares across machines where the microseconds do not.
    report["plugin_contended_over_plain_at_500"] = {
        name: report["plugin_contended_us_per_step"][name]["500"] / rows["500"]
        for name, rows in report["plugin_us_per_step"].items()}
    report["plugin_repeats"] = REPEATS
    report["plugin_target_us_at_500"] = PLUGIN_TARGET_US_AT_500
    for key, verdict in (("plugin_us_per_step", "plugin_meets_target"),
                         ("plugin_contended_us_per_step", "plugin_contended_meets_target")):
        report[verdict] = all(rows["500"] <= PLUGIN_TARGET_US_AT_500 for rows in report[key].values())
    write_results(args.out, report, meta)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
