"""bench.engine_load's summary: streamed and one-shot TTFTs compared seed by seed."""

import pytest

from bench.engine_load import ONE_SHOT_ENGINE, summarize
from scheduler.policies import POLICIES
from stream2llm.data.traces import PromptMode

LEVELS, SEEDS = ["0.25", "4.0"], ["0", "1", "2"]


def _cells(ttfts: dict[str, dict[str, float]]) -> dict:
    """{qps: {seed: one TTFT}} as runs whose P50, P95 and P99 all equal that TTFT."""
    return {q: {s: {f"ttft_p{p}_s": t for p in (50, 95, 99)} for s, t in per_seed.items()}
            for q, per_seed in ttfts.items()}


def _results(stream: dict, one_shot: dict, others: float) -> dict:
    results = {p: {PromptMode.STREAM: _cells({q: dict.fromkeys(SEEDS, others) for q in LEVELS})}
               for p in POLICIES}
    results["tailguard"][PromptMode.STREAM] = _cells(stream)
    results[ONE_SHOT_ENGINE][PromptMode.ONESHOT] = _cells(one_shot)
    return results


def test_ratios_pair_each_seed_with_itself():
    # At QPS 4 streaming wins on seeds 0 and 2 and loses on seed 1 (1.07x); both modes' medians
    # are seed 1's, so a ratio of medians reports the loss, the median per-seed ratio 0.9.
    stream = {"0.25": {"0": 0.1, "1": 0.1, "2": 0.1}, "4.0": {"0": 0.20, "1": 0.321, "2": 1.35}}
    one_shot = {"0.25": {"0": 0.25, "1": 0.2, "2": 0.3}, "4.0": {"0": 0.25, "1": 0.30, "2": 1.5}}
    summary = summarize(_results(stream, one_shot, others=5.0), LEVELS, SEEDS)
    assert summary["stream_vs_oneshot_ratios"]["4.0/p50"] == pytest.approx(0.9)
    assert summary["stream_vs_oneshot_worst_ratio"] == pytest.approx(0.9)
    assert summary["stream_vs_oneshot_worst_ratio_of_medians"] == pytest.approx(1.07)
    assert summary["stream_vs_oneshot_worst_seed_ratio"] == pytest.approx(1.07)
    assert summary["light_load_speedup_p50"] == pytest.approx(2.5)
    assert summary["tailguard_lowest_p99"] is True


def test_a_loss_on_most_seeds_misses_the_target():
    stream = {"0.25": {"0": 0.1, "1": 0.1, "2": 0.1}, "4.0": {"0": 0.30, "1": 0.33, "2": 1.0}}
    one_shot = {"0.25": {"0": 0.2, "1": 0.2, "2": 0.2}, "4.0": {"0": 0.25, "1": 0.30, "2": 1.5}}
    summary = summarize(_results(stream, one_shot, others=0.31), LEVELS, SEEDS)
    assert summary["stream_vs_oneshot_worst_ratio"] == pytest.approx(1.1)
    assert summary["stream_vs_oneshot_worst_seed_ratio"] == pytest.approx(1.2)
    assert summary["light_load_speedup_p50"] == pytest.approx(2.0)
    # another policy's P99 (0.31 s) beats TailGuard's on seeds 1 and 2 at QPS 4
    assert summary["tailguard_p99_lowest_seeds"]["4.0"] == 1
    assert summary["tailguard_lowest_p99"] is False


def test_every_cell_is_replayed_by_every_run_before_the_next(monkeypatch):
    import asyncio
    from types import SimpleNamespace

    import bench.engine_load as engine_load

    calls = []

    async def fake_replay(engine, traces, arrivals, streaming, seed):
        calls.append((engine, streaming, seed))
        return {"ttft_p50_s": 1.0, "ttft_p99_s": 1.0, "preemptions": 0}

    monkeypatch.setattr(engine_load, "replay", fake_replay)
    monkeypatch.setattr(engine_load, "run_key", lambda summary: summary)
    args = SimpleNamespace(qps=(0.5, 4.0), seeds=(0, 2), sessions=2, delay=0.2)
    rows = asyncio.run(engine_load.run_cells(args, {p: p for p in POLICIES}))
    order = engine_load.run_order()
    runs = len(order)
    assert runs == len(POLICIES) + 1 and (ONE_SHOT_ENGINE, PromptMode.ONESHOT) in order
    assert len(calls) == 4 * runs
    for cell in range(4):
        block = calls[cell * runs:(cell + 1) * runs]
        assert len({seed for _, _, seed in block}) == 1  # one cell, whole, before the next
        assert sorted((e, s) for e, s, _ in block) == sorted((p, m == PromptMode.STREAM) for p, m in order)
        assert (block[0][0], block[0][1]) == (order[cell][0], order[cell][1] == PromptMode.STREAM)
    assert set(rows[ONE_SHOT_ENGINE]) == set(PromptMode)
    assert set(rows[ONE_SHOT_ENGINE][PromptMode.ONESHOT]) == {"0.5", "4.0"}
