"""Admission from what the engines really hold (issue 32): the pure logic.

The issue's measurement: one replica of the tiny model with 4,096 KV blocks of 32 tokens; client
sessions opened with one short chunk each; the 61st was refused at 1.5% real KV use because every
session reserved the 2,048-token prior. These tests reproduce that arithmetic, then check that the
budget now follows real use, sequence slots and a learned growth percentile.
"""

import pytest

from scheduler.admission import AdmissionController, DemandModel, ReplicaReport, blocks_for

BLOCKS, BLOCK = 4096, 32  # the issue's replica: kv_cache_memory_bytes 64 MiB of the tiny model


def report(rid="a", used=0, sessions=None, running=0, waiting=0, seqs=64, total=BLOCKS):
    sessions = sessions or {}
    return ReplicaReport(rid, total, used, BLOCK, sessions=sessions, source_types={s: "client" for s in sessions},
                         max_num_seqs=seqs, running=running, waiting=waiting)


def controller(overcommit=2.0, reserve=0.05, priors=None):
    return AdmissionController(DemandModel(priors or {"client": 2048}), max_queue=16, stale_after_s=5.0,
                               reserve_frac=reserve, overcommit=overcommit)


def open_short_sessions(c: AdmissionController, count: int, tokens: int = 12) -> int:
    """Open sessions one by one, each reported holding one short chunk; returns how many were placed."""
    held: dict[str, int] = {}
    c.report(report(), now=0)
    for i in range(count):
        if c.try_admit(f"s{i}", "client", now=i * 0.01) is None:
            break
        held[f"s{i}"] = tokens
        used = sum(blocks_for(t, BLOCK) for t in held.values())
        c.report(report(used=used, sessions=dict(held)), now=i * 0.01)
    return len(held)


def test_the_issues_failure_without_overcommit_and_its_fix():
    # Before: every client session reserved the 2,048-token prior (64 blocks): 60 fit in the
    # 3,892 blocks left after the 5% reserve, at 1.5% real use.
    assert open_short_sessions(controller(overcommit=1.0), 200) == 60
    c = controller()  # the default: the engine parks idle streams and evicts them under pressure
    assert open_short_sessions(c, 100) == 100
    p = c.pressure(now=2)
    assert p.sessions == 100 and p.used_frac < 0.03 and p.budget_frac < 1.0


def test_learned_percentile_replaces_the_prior():
    c = controller(overcommit=1.0)
    c.report(report(), now=0)
    for i in range(10):  # ten client sessions finished at 40..400 tokens
        c.try_admit(f"done{i}", "client", now=0)
        c.release(f"done{i}", context_tokens=40 * (i + 1))
    assert c.demand.expected_tokens("client") == 360  # P90 of what they reached, not the prior
    # Projected at 12 blocks each (360 tokens), not 64: five times the sessions fit without overcommit.
    assert open_short_sessions(c, 400) == 3892 // 12


def test_a_session_is_projected_from_its_size_now():
    c = controller(overcommit=1.0)
    c.report(report(), now=0)
    for tokens in (100, 200, 300, 4000):
        c.try_admit(f"d{tokens}", "client", now=0)
        c.release(f"d{tokens}", context_tokens=tokens)
    c.try_admit("big", "client", now=1)
    c.report(report(used=20, sessions={"big": 640}), now=1)  # already past 300: projected from the tail
    assert c.placement("big").reserved_blocks == blocks_for(4000, BLOCK)


def test_real_use_refuses_whatever_the_projection_says():
    c = controller(overcommit=4.0)
    c.report(report(used=int(BLOCKS * 0.94)), now=0)  # KV full of what the replica really holds
    assert c.try_admit("s", "client", now=0) is None
    c.report(report(used=int(BLOCKS * 0.5)), now=1)
    assert c.try_admit("s", "client", now=1) == "a"


def test_context_accepted_but_not_yet_in_kv_counts_as_real():
    c = controller(overcommit=4.0)
    c.report(report(), now=0)
    c.try_admit("s", "client", now=0)
    # The replica accepted 3,850 blocks of context that its KV does not hold yet (prefill running).
    c.report(report(used=10, sessions={"s": 3850 * BLOCK}), now=1)
    assert c.try_admit("t", "client", now=1) is None


def test_a_saturated_engine_takes_no_new_session():
    c = controller()
    c.report(report("a", running=64, waiting=64), now=0)  # a whole batch waits behind its slots
    c.report(report("b", used=2000, running=10), now=0)
    assert c.try_admit("s", "client", now=0) == "b"
    c.report(report("b", used=2000, running=64, waiting=70), now=1)
    assert c.try_admit("t", "client", now=1) is None
    p = c.pressure(now=1)
    assert p.seq_frac == 1.0 and p.load_frac == 1.0 and p.waiting == 134


def test_load_fraction_reads_real_signals_not_the_projection():
    c = controller(overcommit=2.0, reserve=0.0)
    c.report(report(used=1024, running=8), now=0)
    p = c.pressure(now=0)
    assert p.used_frac == 0.25 and p.seq_frac == 0.125 and p.budget_frac == pytest.approx(1024 / 8192)
    assert p.load_frac == 0.25
    open_short_sessions(c, 100)  # projected at the prior: 100 x 64 blocks, but 100 blocks really used
    p = c.pressure(now=2)
    assert p.budget_frac > 0.75 and p.load_frac < 0.05


def test_a_request_no_replica_holds_never_fits():
    c = controller()
    assert c.fits_anywhere(10 ** 9)  # nothing reported yet: unknown, not refused
    c.report(report(), now=0)
    assert c.fits_anywhere(BLOCKS * BLOCK) and not c.fits_anywhere(BLOCKS * BLOCK + 1)


def test_overcommit_below_one_is_refused_and_a_redeploy_changes_it_in_place():
    with pytest.raises(ValueError):
        controller(overcommit=1.0).configure(overcommit=0.5)
    c = controller(overcommit=1.0)
    assert open_short_sessions(c, 200) == 60
    c.configure(overcommit=2.0, growth_percentile=0.5)
    assert c.try_admit("more", "client", now=5) == "a"
    assert c.demand.percentile == 0.5 and c.pressure(now=5).kv_blocks_budget == 2 * 3892


def test_a_session_whose_question_arrived_is_projected_at_its_size_now():
    # A session still streaming is projected at its type's prior (2,048 tokens: 64 blocks) until its
    # type has learned; once its question arrives the replica flags it complete and the projection
    # falls to what it holds, whatever the type has learned.
    c = controller()
    c.report(report(), now=0)
    assert c.try_admit("s", "client", now=0) == "a"
    c.report(report(used=10, sessions={"s": 300}), now=1)
    assert c.projections("a") == {"s": 64}
    before = c.projected_used("a")
    c.report(ReplicaReport("a", BLOCKS, 10, BLOCK, sessions={"s": 300}, source_types={"s": "client"},
                           max_num_seqs=64, complete=("s",)), now=2)
    assert c.projections("a") == {"s": blocks_for(300, BLOCK)}
    assert c.projected_used("a") == before - (64 - blocks_for(300, BLOCK))
