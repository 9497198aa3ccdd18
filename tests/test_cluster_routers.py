"""Cluster routers of the simulator (`scheduler.simulator.routers`): each one's choice on a
hand-built state, and the central router running the real admission code."""

from dataclasses import dataclass

import pytest

import scheduler.admission as admission
from scheduler.gpu_model import PRESETS
from scheduler.policies import make_policy
from scheduler.simulator import SimConfig, SimEngine, SimEngineConfig, simulate
from scheduler.simulator.routers import ROUTERS, SessionAsk, UnknownRouterError, make_router
from stream2llm.data.traces import PromptMode, synthetic_crawler_traces

COST = PRESETS["h200"]()


@dataclass
class Replica:
    num_active: int


def ask(sid="s", source="crawler"):
    return SessionAsk(sid, source)


def test_round_robin_takes_each_replica_in_turn_whatever_they_hold():
    router = make_router("round_robin")
    router.bind([Replica(9), Replica(0), Replica(5)], 0.0)
    assert [router.place(ask(str(i)), 0.0) for i in range(5)] == [0, 1, 2, 0, 1]


def test_affinity_hashes_the_session_id_and_ignores_load():
    router = make_router("affinity")
    router.bind([Replica(0)] * 8, 0.0)
    first = router.place(ask("session-a"), 0.0)
    router.replicas[first].num_active = 100
    assert router.place(ask("session-a"), 1.0) == first
    assert len({router.place(ask(f"s{i}"), 0.0) for i in range(64)}) > 4  # spread, not one replica


def test_least_active_reads_the_live_count():
    router = make_router("least_active")
    router.bind([Replica(3), Replica(1), Replica(2)], 0.0)
    assert router.place(ask(), 0.0) == 1


def test_pow2_probes_when_its_cache_is_empty_then_trusts_its_own_counts_until_they_go_stale():
    router = make_router("pow2", seed=0, routers=1, max_ongoing_requests=4)
    replicas = [Replica(3), Replica(1)]
    router.bind(replicas, 0.0)
    assert router.place(ask("a"), 0.0) == 1 and router.probes == 2  # probed: 3 vs 1
    replicas[1].num_active = 50  # another router's sessions: this cache does not see them
    assert router.place(ask("b"), 1.0) == 1 and router.probes == 2  # cached 2 < 3
    tied = router.place(ask("c"), 2.0)  # cached 3 vs 3: either; it goes to 4, full
    assert router.place(ask("d"), 3.0) == 1 - tied and router.probes == 2  # the full one is skipped
    assert router.place(ask("e"), 20.0) == 0 and router.probes == 4  # entries older than 10 s: probed


def test_pow2_treats_a_full_cached_replica_as_unknown_and_decrements_on_finish():
    router = make_router("pow2", seed=1, routers=1, max_ongoing_requests=2)
    replicas = [Replica(0), Replica(0)]
    router.bind(replicas, 0.0)
    chosen = router.place(ask("a"), 0.0)
    cache = router.caches[0]
    cache.update(1 - chosen, 2, 0.0)  # the other one full (== max_ongoing_requests)
    probes = router.probes
    assert router.place(ask("b"), 0.5) == chosen and router.probes == probes  # cached 1 < 2 wins
    router.on_finish("a", chosen, 100, 1.0)
    assert cache.get(chosen, 1.0) == 1


def _engine(used_blocks: int) -> SimEngine:
    engine = SimEngine(make_policy("fcfs"), COST, SimEngineConfig(1000, 16))
    if used_blocks:
        engine.blocks.allocate("someone", used_blocks)
    return engine


def test_central_places_on_the_roomiest_reported_replica_and_queues_when_none_has_room():
    engines = [_engine(900), _engine(100)]
    router = make_router("central", priors={"crawler": 4096}, overcommit=1.0, reserve_frac=0.0)
    router.bind(engines, 0.0)  # first reports at start-up
    assert router.place(ask("a"), 0.1) == 1
    engines[1].blocks.allocate("more", 800)  # fills before its next report: the router cannot know
    assert router.place(ask("b"), 0.2) == 1
    router.on_report(1, 1.0)  # now it knows: neither replica has 256 blocks of room
    assert router.place(ask("c"), 1.1) is None
    assert router.admitted(1.2) == []
    engines[0].blocks.free("someone")
    router.on_report(0, 2.0)
    assert router.admitted(2.0) == [("c", 0)]
    assert router.stats()["most_placed_between_reports"] == 2


def test_the_central_router_runs_the_real_admission_controller(monkeypatch):
    calls = {"admit_ask": 0, "report": 0, "release": 0}
    for name in calls:
        real = getattr(admission.AdmissionController, name)

        def counted(self, *args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(self, *args, **kwargs)
        monkeypatch.setattr(admission.AdmissionController, name, counted)
    router = make_router("central")
    assert type(router.controller) is admission.AdmissionController
    traces = synthetic_crawler_traces(30, 0)
    config = SimConfig("fcfs", PromptMode.STREAM, SimEngineConfig(2000, 16), 4, 3.0, 0, router="central")
    result = simulate(traces, config, COST)
    assert len(result.ttft_s) == 30
    assert calls["admit_ask"] >= 30 and calls["release"] == 30
    assert calls["report"] >= 4 * int(result.makespan_s)  # each replica, about every second


def test_an_unknown_router_lists_the_valid_names():
    with pytest.raises(UnknownRouterError) as err:
        make_router("p2c")
    assert err.value.valid == sorted(ROUTERS) and "central" in str(err.value)
    with pytest.raises(UnknownRouterError):
        SimConfig("fcfs", PromptMode.STREAM, SimEngineConfig(100), router="p2c")
