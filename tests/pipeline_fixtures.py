"""Shared helpers of the pipeline tests: a real Ray + Serve app on loopback, SSE parsing."""

from __future__ import annotations

import contextlib
import json
import time

import httpx

from pipeline.run.local import REPO, local_app  # noqa: F401 (REPO re-exported)
from tests.conftest import TINY_DTYPE  # noqa: F401 (re-exported)


def tiny_config(**sections) -> dict:
    """An AppConfig dict for mechanics tests: tiny model, small KV, 1 CPU per replica."""
    base = {
        "model": {"model": "tiny", "dtype": TINY_DTYPE, "max_model_len": 2048, "kv_cache_memory_bytes": 16 << 20,
                  "answer_budget_tokens": 512},
        "replicas": {"min_replicas": 2, "max_replicas": 2, "num_cpus": 1.0, "report_interval_s": 0.5},
        "limits": {"max_chunks_per_session": 6, "max_context_tokens": 1200, "session_ttl_s": 8.0,
                   "max_queue": 1, "admission_timeout_s": 2.0, "max_request_bytes": 64 * 1024},
        # no overcommit: the admission tests fill a replica by projected sizes alone ('big' sessions)
        "scheduler": {"demand_priors": {"client": 256, "big": 20000, "huge": 10 ** 7},
                      "stale_after_s": 3.0, "overcommit": 1.0},
        # a pool starts at its first request: modules that retrieve nothing start no retriever actors
        "retrievers": {"warm_pools": False},
    }
    for name, values in sections.items():
        base.setdefault(name, {}).update(values)
    return base


@contextlib.contextmanager
def serve_app(config_dict: dict, num_cpus: int = 2, address: str | None = None):
    """Start Ray (in-process driver), Serve on a free loopback port, deploy; always tear down."""
    from pipeline.config import AppConfig

    with local_app(AppConfig.model_validate(config_dict), num_cpus=num_cpus, address=address,
                   ready_timeout_s=180.0) as base:
        yield base


def parse_sse(text: str) -> list[tuple[str, dict]]:
    events = []
    for block in text.strip().split("\n\n"):
        name, data = None, None
        for line in block.splitlines():
            if line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: "):
                data = json.loads(line[len("data: "):])
        if name is not None:
            events.append((name, data))
    return events


def cluster_view(base: str, headers: dict | None = None) -> dict:
    return httpx.get(f"{base}/v1/cluster", headers=headers, timeout=10).json()


def wait_until(predicate, timeout: float = 30.0, interval: float = 0.25):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError("condition not met in time")
