"""bench.process_cpu: roles from process titles, and CPU counted between two snapshots of real processes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench.process_cpu import cpu_by_role, role_of, snapshot

# A child that burns `cpu_s` of CPU, says so, then waits for its stdin to close; the extra argument
# puts a Serve controller's title in its command line.
BURN = ("import sys, time\n"
        "while time.process_time() < float(sys.argv[1]): pass\n"
        "print('burnt', flush=True); sys.stdin.read()\n")


@pytest.mark.parametrize("cmdline, role", [
    ("ray::ServeReplica:stream2llm:EngineReplica", "engine_replica"),
    ("ray::ServeReplica:stream2llm:Ingress", "ingress"),
    ("VLLM::EngineCore", "vllm_engine_core"),
    ("/venv/bin/python -m engine.vllm_cli serve /models/smollm2 --port 1", "vllm_api_server"),
    ("/venv/lib/python3.11/site-packages/ray/core/src/ray/gcs/gcs_server --log_dir=x", "ray_gcs"),
    ("ray::IDLE", "ray_idle_workers"),
    ("/usr/bin/vim notes.txt", "other"),
])
def test_role_of_names_the_process_by_its_title(cmdline, role):
    assert role_of(cmdline) == role


def test_cpu_between_snapshots_is_the_difference_and_a_new_process_counts_whole():
    before = {1: ("ingress", 10.0), 2: ("raylet", 5.0)}
    after = {1: ("ingress", 12.5), 2: ("raylet", 5.25), 3: ("ingress", 1.0)}
    assert cpu_by_role(before, after) == {"ingress": 3.5, "raylet": 0.25}


def test_a_real_process_cpu_lands_under_its_role():
    before = snapshot()
    child = subprocess.Popen([sys.executable, "-c", BURN, "0.3", "ray::ServeController"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "burnt"
        after = snapshot()
    finally:
        child.stdin.close()
        child.wait(timeout=30)
    role, cpu = after[child.pid]
    assert role == "serve_controller" and cpu >= 0.25  # /proc counts in clock ticks: a little under 0.3
    # the child and any other controller; the sum is rounded to /proc's 10 ms as the figures are
    assert cpu_by_role(before, after)["serve_controller"] >= round(cpu, 2)
