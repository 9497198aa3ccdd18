"""The list of vLLM's private seams (`engine.vllm_seams`) checked against the installed vLLM, its
completeness against what the plug-in overrides, and the error a moved seam gives."""

import inspect

import pytest
from vllm.v1.core.sched.scheduler import Scheduler

from engine.vllm_scheduler import PolicySchedulerMixin, StreamingScheduler
from engine.vllm_seams import SCHEDULER_METHODS, VllmSeamError, check_scheduler, check_vllm
from engine.vllm_sessions import SessionParkingMixin
from tests.sched_harness import make_scheduler


def test_the_installed_vllm_has_every_seam():
    check_vllm()
    check_scheduler(make_scheduler(StreamingScheduler, "fcfs"))  # (its __init__ checks both too)


def test_every_vllm_method_the_plug_in_overrides_is_listed():
    listed = {seam.name for seam in SCHEDULER_METHODS}
    for mixin in (PolicySchedulerMixin, SessionParkingMixin):
        for name, member in vars(mixin).items():
            if inspect.isfunction(member) and name != "__init__" and hasattr(Scheduler, name):
                assert name in listed, f"{mixin.__name__}.{name} overrides vLLM's: list it in engine/vllm_seams.py"


def test_a_missing_method_is_named(monkeypatch):
    monkeypatch.delattr(Scheduler, "_set_kv_fetch_stage")
    with pytest.raises(VllmSeamError, match=r"Scheduler\._set_kv_fetch_stage, which this vLLM does not have"):
        check_vllm()


def test_a_changed_signature_is_named(monkeypatch):
    monkeypatch.setattr(Scheduler, "_preempt_request", lambda self, request, drop_stale_output=False: None)
    with pytest.raises(VllmSeamError, match=r"Scheduler\._preempt_request, which takes \(request, drop_stale_output\)"):
        check_vllm()


def test_another_vllm_release_is_refused():
    with pytest.raises(VllmSeamError, match=r"vLLM 0\.33\.0 is installed; .* written against vLLM 0\.32"):
        check_vllm(version="0.33.0")
    check_vllm(version="0.32.0+cpu")  # the CPU build's local version label is the same release


def test_a_scheduler_attribute_gone_is_named():
    s = make_scheduler(StreamingScheduler, "fcfs")
    del s.kv_holding_waiting
    with pytest.raises(VllmSeamError, match=r"Scheduler instance\.kv_holding_waiting, which vLLM's Scheduler no longer sets"):
        check_scheduler(s)


def test_the_plug_in_refuses_to_start_on_a_moved_seam(monkeypatch):
    monkeypatch.delattr(Scheduler, "_enqueue_waiting_request")
    with pytest.raises(VllmSeamError, match="_enqueue_waiting_request"):
        make_scheduler(StreamingScheduler, "fcfs")
