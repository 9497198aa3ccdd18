"""Central scheduler at cluster scale, through the real Ray actor (no model).

    python -m bench.central [--quick]  ->  bench/results/central.json

256 simulated replicas report every second (each report lists its ~78 open sessions, so the actor
refreshes 20,000 session sizes per second), 20,000 sessions stay open, and load generators (Ray
actors in their own processes) admit a new session and release it again, through
`CentralClient` as the ingress has it (batched calls, `--slots` admission slots; the release is
posted and rides the next batch, ahead of that batch's admissions). Two loads, each `--repeats`
runs, figures the median (spread recorded):
- capacity, `admits_per_s`: a closed loop, a fixed number of callers each admitting again as soon
  as it is answered. It saturates the actor, so its latency is set by the number of callers (Little's
  law: callers / throughput), not by the actor; it is kept as `saturated`.
- latency, `admit_p50_ms` / `admit_p99_ms`: an open loop offering the target rate (Poisson arrivals,
  `offered_admits_per_s`, split over the generators), each admission timed from its scheduled arrival,
  so an admission delayed behind a slow one counts its wait (no coordinated omission).
Latency is measured by the caller around the `admit` call (Ray round trip included, when there is
one). Targets: `admits_per_s` >= 5,000, `admit_p99_ms` < 5 at 5,000 admissions/s. For comparison,
one run of each load without slots (`without_slots`), the closed loop with one actor call per
operation (`unbatched`), the bare Ray round trip to the actor (one caller, an empty call at a time,
under the same reports), and `logic_in_process`, the pure admission logic alone at the same scale.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import time
from pathlib import Path

import ray

from bench.results_meta import start_run, write_results
from bench.stats import percentile
from pipeline.control.central import get_or_create_scheduler
from pipeline.control.central_client import CentralClient
from pipeline.config import AppConfig, SchedulerSettings
from scheduler.admission import AdmissionController, DemandModel, ReplicaReport

RESULTS = Path(__file__).parent / "results" / "central.json"
REPLICAS = 256
OPEN_SESSIONS = 20_000
REPORT_INTERVAL_S = 1.0
BLOCKS_PER_REPLICA = 40_000   # room for the open sessions plus the churn at the learned demand
TARGETS = {"admits_per_s": 5000, "admit_p99_ms": 5.0}


@ray.remote(num_cpus=0)
class Reporter:
    """Opens the long-lived sessions, then reports every replica once per interval."""

    def __init__(self, scheduler, replicas: int, sessions: int):
        self.scheduler, self.replicas = scheduler, [f"replica-{i:03d}" for i in range(replicas)]
        self.held: dict[str, dict[str, int]] = {r: {} for r in self.replicas}
        self.sessions, self.rounds, self.late, self.stopped = sessions, 0, 0, False

    def _report(self, rid: str) -> dict:
        held = self.held[rid]
        return {"replica_id": rid, "kv_blocks_total": BLOCKS_PER_REPLICA, "kv_blocks_used": len(held) * 64,
                "block_size": 16, "sessions": held, "source_types": dict.fromkeys(held, "client")}

    async def open_sessions(self) -> int:
        async def one(i):
            decision = await self.scheduler.admit.remote(f"open-{i}", "client", 30.0)
            if "replica_id" not in decision:
                raise RuntimeError(f"could not open session {i}: {decision}")
            self.held[decision["replica_id"]][f"open-{i}"] = 1024
        for start in range(0, self.sessions, 500):
            await asyncio.gather(*(one(i) for i in range(start, min(start + 500, self.sessions))))
        return sum(len(h) for h in self.held.values())

    async def run(self) -> dict:
        """Each replica reports once per interval, spread over the interval as real ones are."""
        await asyncio.gather(*(self.scheduler.report.remote(self._report(r)) for r in self.replicas))
        gap = REPORT_INTERVAL_S / len(self.replicas)
        while not self.stopped:
            start = time.monotonic()
            for i, rid in enumerate(self.replicas):
                await asyncio.sleep(max(0.0, start + i * gap - time.monotonic()))
                self.scheduler.report.remote(self._report(rid))  # replicas do not wait on each other
            self.rounds += 1
            if time.monotonic() - start > 1.5 * REPORT_INTERVAL_S:
                self.late += 1
        return {"report_rounds": self.rounds, "late_rounds": self.late}

    def stop(self) -> None:
        self.stopped = True


@ray.remote(num_cpus=0)
class LoadGenerator:
    """`concurrency` callers, each admitting a new session then releasing it, until the deadline."""

    def __init__(self, scheduler, name: str, batched: bool, slots: int = 0):
        self.handle, self.name, self.batched = scheduler, name, batched
        self.scheduler = CentralClient(scheduler, slots=slots) if batched else scheduler

    async def ping(self, duration_s: float) -> list[float]:
        """One caller, one empty actor call at a time: the Ray round trip on this machine, same load."""
        latencies, end = [], time.monotonic() + duration_s
        while time.monotonic() < end:
            t0 = time.perf_counter()
            await self.handle.ping.remote()
            latencies.append(time.perf_counter() - t0)
        return latencies

    async def run_open(self, rate_per_s: float, duration_s: float, seed: int) -> dict:
        """Admissions arriving as a Poisson process at `rate_per_s`, whether or not earlier ones are
        answered; each latency runs from the arrival's scheduled time."""
        latencies: list[float] = []
        rejected, pending, rng = 0, set(), random.Random(seed)

        async def one(sid: str, due: float):
            nonlocal rejected
            decision = await self.scheduler.admit(sid, "client", 5.0)
            latencies.append(time.perf_counter() - due)
            rejected += "rejected" in decision
            self.scheduler.release(sid, 1024)
        started = time.perf_counter()
        due, n = started, 0
        while due < started + duration_s:
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            while due <= time.perf_counter():  # late wake-ups send what fell due meanwhile
                task = asyncio.create_task(one(f"{self.name}-o{n}", due))
                pending.add(task)
                task.add_done_callback(pending.discard)
                n, due = n + 1, due + rng.expovariate(rate_per_s)
        await asyncio.gather(*pending)
        await self.scheduler.flush()
        return {"latencies": latencies, "rejected": rejected, "elapsed_s": time.perf_counter() - started,
                "actor_calls": self.scheduler.calls, "from_slots": self.scheduler.from_slots}

    async def run(self, concurrency: int, duration_s: float) -> dict:
        latencies: list[float] = []
        rejected = 0
        end = time.monotonic() + duration_s

        async def caller(c):
            nonlocal rejected
            n = 0
            while time.monotonic() < end:
                sid = f"{self.name}-{c}-{n}"
                n += 1
                t0 = time.perf_counter()
                decision = await (self.scheduler.admit(sid, "client", 5.0) if self.batched
                                  else self.scheduler.admit.remote(sid, "client", 5.0))
                latencies.append(time.perf_counter() - t0)
                if "rejected" in decision:
                    rejected += 1
                if self.batched:
                    self.scheduler.release(sid, 1024)  # posted, as the ingress does
                else:
                    await self.scheduler.release.remote(sid, 1024)
        started = time.monotonic()
        await asyncio.gather(*(caller(c) for c in range(concurrency)))
        if self.batched:
            await self.scheduler.flush()
        calls = self.scheduler.calls if self.batched else 2 * len(latencies)
        return {"latencies": latencies, "rejected": rejected, "elapsed_s": time.monotonic() - started,
                "actor_calls": calls, "from_slots": self.scheduler.from_slots if self.batched else 0}


def ms_at(latencies: list[float], q: float) -> float | None:
    """The `q`-th percentile of `latencies` (seconds) in ms, rounded; None when there are none."""
    value = percentile(latencies, q)
    return None if value is None else round(1000 * value, 3)


def measure(scheduler, batched: bool, generators: int, concurrency: int, duration_s: float,
            slots: int = 0) -> dict:
    """Closed loop: `concurrency` callers per generator, each admitting again once answered."""
    mode = f"b{slots}" if batched else "u"
    gens = [LoadGenerator.remote(scheduler, f"{mode}-{i}", batched, slots) for i in range(generators)]
    results = ray.get([g.run.remote(concurrency, duration_s) for g in gens])
    return {"batched": batched, "slots": slots, "generators": generators, "concurrency_per_generator": concurrency,
            **summarize(results)}


def measure_open(scheduler, rate_per_s: float, generators: int, duration_s: float, seed: int,
                 slots: int) -> dict:
    """Open loop at `rate_per_s` in all (batched callers), split evenly over the generators."""
    gens = [LoadGenerator.remote(scheduler, f"o{slots}-{seed}-{i}", True, slots) for i in range(generators)]
    results = ray.get([g.run_open.remote(rate_per_s / generators, duration_s, 1000 * seed + i)
                       for i, g in enumerate(gens)])
    return {"offered_admits_per_s": rate_per_s, "slots": slots, "generators": generators, "seed": seed,
            **summarize(results)}


def summarize(results: list[dict]) -> dict:
    latencies = [x for r in results for x in r["latencies"]]
    elapsed = max(r["elapsed_s"] for r in results)
    return {
        "duration_s": round(elapsed, 2), "admits": len(latencies),
        "rejected": sum(r["rejected"] for r in results),
        "actor_calls_per_admit": round(sum(r["actor_calls"] for r in results) / max(1, len(latencies)), 3),
        "from_slots_frac": round(sum(r["from_slots"] for r in results) / max(1, len(latencies)), 3),
        "admits_per_s": round(len(latencies) / elapsed, 1),
        "admit_p50_ms": ms_at(latencies, 50),
        "admit_p99_ms": ms_at(latencies, 99),
    }


def logic_cost(admits: int = 20_000) -> dict:
    """The pure admission logic alone, in this process, at the same scale: what the actor's work
    costs without Ray (admit + release of a new session; one round of every replica's report)."""
    ctl = AdmissionController(DemandModel({"client": 1024}), max_queue=1024)
    held: dict[str, dict[str, int]] = {f"replica-{i:03d}": {} for i in range(REPLICAS)}

    def report(rid: str) -> ReplicaReport:
        return ReplicaReport(replica_id=rid, kv_blocks_total=BLOCKS_PER_REPLICA, kv_blocks_used=len(held[rid]) * 64,
                             block_size=16, sessions=held[rid], source_types=dict.fromkeys(held[rid], "client"))
    for rid in held:
        ctl.report(report(rid), time.monotonic())
    for i in range(OPEN_SESSIONS):
        held[ctl.try_admit(f"open-{i}", "client", time.monotonic())][f"open-{i}"] = 1024
    start = time.perf_counter()
    for i in range(admits):
        ctl.try_admit(f"x{i}", "client", time.monotonic())
        ctl.release(f"x{i}", 1024)
    per_admit = (time.perf_counter() - start) / admits
    start = time.perf_counter()
    for rid in held:
        ctl.report(report(rid), time.monotonic())
    return {"us_per_admit_release": round(1e6 * per_admit, 2),
            "ms_per_report_round": round(1e3 * (time.perf_counter() - start), 2)}


def ray_round_trip(scheduler, duration_s: float) -> dict:
    pinger = LoadGenerator.remote(scheduler, "ping", False)
    latencies = ray.get(pinger.ping.remote(duration_s))
    return {"calls": len(latencies), "p50_ms": ms_at(latencies, 50), "p99_ms": ms_at(latencies, 99)}


def median_of(runs: list[dict], keys: tuple[str, ...]) -> dict:
    """Each of `keys`' median over the runs, with its spread (min, max); the other keys (admits,
    rejections, calls per admission) are the first run's, and every run is kept."""
    out = {k: statistics.median(r[k] for r in runs) for k in keys}
    out["spread"] = {k: [min(r[k] for r in runs), max(r[k] for r in runs)] for k in keys}
    return {**runs[0], **out, "repeats": len(runs), "runs": runs}


def run(duration_s: float, generators: int, concurrency: int, repeats: int, slots: int) -> dict:
    """Headline: callers as the ingress has them (`CentralClient` with `slots` admission slots):
    capacity from the closed loop, latency from the open loop at the target rate, each the median
    of `repeats` runs. For comparison, one run of each load batched without slots, the closed loop
    with one actor call per operation, and the bare Ray round trip to the actor, under the same reports."""
    config = AppConfig.model_validate({"limits": {"max_queue": 1024},
                                       "scheduler": {"actor_name": "bench_central", "reserve_frac": 0.0}})
    scheduler = get_or_create_scheduler(config)
    reporter = Reporter.remote(scheduler, REPLICAS, OPEN_SESSIONS)
    reporting = reporter.run.remote()
    opened = ray.get(reporter.open_sessions.remote())
    time.sleep(REPORT_INTERVAL_S)  # a full round of reports listing the open sessions before measuring
    figures = ("admits_per_s", "admit_p50_ms", "admit_p99_ms")
    saturated = median_of([measure(scheduler, True, generators, concurrency, duration_s, slots)
                           for _ in range(repeats)], figures)
    at_target = median_of([measure_open(scheduler, TARGETS["admits_per_s"], generators, duration_s, seed, slots)
                           for seed in range(repeats)], figures)
    no_slots = {"saturated": measure(scheduler, True, generators, concurrency, duration_s),
                "at_target_rate": measure_open(scheduler, TARGETS["admits_per_s"], generators, duration_s, 0, 0)}
    unbatched = measure(scheduler, False, generators, concurrency, duration_s / 2)
    round_trip = ray_round_trip(scheduler, duration_s / 4)
    pressure = ray.get(scheduler.pressure.remote())
    ray.get(reporter.stop.remote())
    reports = ray.get(reporting)
    return {"replicas": REPLICAS, "open_sessions": opened, "report_interval_s": REPORT_INTERVAL_S,
            "admits_per_s": saturated["admits_per_s"], "admit_p50_ms": at_target["admit_p50_ms"],
            "admit_p99_ms": at_target["admit_p99_ms"], "slots": slots, "generators": generators,
            "saturated": saturated, "at_target_rate": at_target, "without_slots": no_slots,
            "unbatched": unbatched, "ray_round_trip": round_trip, "sessions_after": pressure["sessions"],
            "replicas_live_after": pressure["replicas"], **reports}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="5 s of load instead of 20 s, one run")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each load; the figures are their median")
    ap.add_argument("--generators", type=int, default=2, help="load generator processes")
    ap.add_argument("--concurrency", type=int, default=16, help="concurrent callers per generator")
    ap.add_argument("--slots", type=int, default=SchedulerSettings().admission_slots,
                    help="admission slots per load process (the ingress default); 0 = none")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    repeats = 1 if args.quick else args.repeats
    meta = start_run(model=None, dtype=None, seeds=list(range(repeats)))  # the open loop's arrivals
    ray.init(address="local", num_cpus=max(2, os.cpu_count() or 2), include_dashboard=False, namespace="stream2llm")
    try:
        report = run(5.0 if args.quick else 20.0, args.generators, args.concurrency,
                     repeats, args.slots)
    finally:
        ray.shutdown()
    report["logic_in_process"] = logic_cost()
    report["targets"] = TARGETS
    report["met"] = {"admits_per_s": report["admits_per_s"] >= TARGETS["admits_per_s"],
                     "admit_p99_ms": report["admit_p99_ms"] < TARGETS["admit_p99_ms"]}
    write_results(args.out, report, meta)
    print({k: v for k, v in report.items() if k != "targets"})
    return report


if __name__ == "__main__":
    main()
