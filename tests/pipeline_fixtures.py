"""Shared helpers of the pipeline tests: a real Ray + Serve app on loopback, SSE parsing."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path

import httpx

REPO = str(Path(__file__).resolve().parent.parent)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_config(**sections) -> dict:
    """An AppConfig dict for mechanics tests: tiny model, small KV, 1 CPU per replica."""
    base = {
        "model": {"model": "tiny", "max_model_len": 2048, "kv_cache_memory_bytes": 16 << 20},
        "replicas": {"min_replicas": 2, "max_replicas": 2, "num_cpus": 1.0, "report_interval_s": 0.5},
        "limits": {"max_chunks_per_session": 6, "max_context_tokens": 1200, "session_ttl_s": 8.0,
                   "max_queue": 1, "admission_timeout_s": 2.0, "max_request_bytes": 64 * 1024},
        "scheduler": {"demand_priors": {"client": 256, "big": 20000, "huge": 10 ** 7},
                      "stale_after_s": 3.0},
    }
    for name, values in sections.items():
        base.setdefault(name, {}).update(values)
    return base


@contextlib.contextmanager
def serve_app(config_dict: dict, num_cpus: int = 2, address: str | None = None):
    """Start Ray (in-process driver), Serve on a free loopback port, deploy; always tear down."""
    import ray
    from ray import serve

    from pipeline.app import build_app
    from pipeline.config import AppConfig

    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), REPO) if p)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    port = free_port()
    if address is None:
        ray.init(num_cpus=num_cpus, include_dashboard=False)
    else:
        ray.init(address=address)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port}, proxy_location="HeadOnly")
        config = AppConfig.model_validate(config_dict)
        serve.run(build_app(config), name=config.name, route_prefix="/")
        base = f"http://127.0.0.1:{port}"
        wait_ready(base)
        yield base
    finally:
        with contextlib.suppress(Exception):
            serve.shutdown()
        ray.shutdown()


def wait_ready(base: str, timeout: float = 180.0, replicas: int = 1) -> None:
    """Until /healthz says the replicas reported to the central scheduler."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            r = httpx.get(f"{base}/healthz", timeout=5)
            if r.status_code == 200 and r.json()["replicas"] >= replicas:
                return
        time.sleep(0.5)
    raise TimeoutError(f"{base} not ready within {timeout} s")


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


def cluster_view(base: str) -> dict:
    return httpx.get(f"{base}/v1/cluster", timeout=10).json()


def wait_until(predicate, timeout: float = 30.0, interval: float = 0.25):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError("condition not met in time")
