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
