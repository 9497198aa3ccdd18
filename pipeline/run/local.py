"""Run the Serve application on this machine: local Ray, Serve on a loopback port, torn down after.

    with local_app(AppConfig()) as base_url:      # "http://127.0.0.1:<free port>"
        ...

The demo, the benchmarks and the tests all start the application this way.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from pathlib import Path

import httpx

from pipeline.config import AppConfig

REPO = str(Path(__file__).resolve().parents[2])  # the checkout root


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def local_app(config: AppConfig, *, num_cpus: int | None = None, address: str | None = None,
              port: int | None = None, ready_replicas: int = 1, ready_timeout_s: float = 300.0):
    """Start Ray (this process is the driver), deploy on 127.0.0.1, wait until replicas report."""
    import ray
    from ray import serve

    from pipeline.app import SERVE_LOOP_ENV, build_app

    # Ray workers import this checkout's packages even when it is not installed.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), REPO) if p)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for key, value in SERVE_LOOP_ENV.items():  # Serve's proxy when Ray starts here (replicas: their options)
        os.environ.setdefault(key, value)
    port = port or free_port()
    if address is None:
        # "local": a Ray of its own, even when another cluster on this machine was started with `ray start`
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    else:
        ray.init(address=address)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port}, proxy_location="HeadOnly")
        serve.run(build_app(config), name=config.name, route_prefix="/")
        base = f"http://127.0.0.1:{port}"
        wait_ready(base, ready_timeout_s, ready_replicas)
        yield base
    finally:
        with contextlib.suppress(Exception):
            serve.shutdown()
        ray.shutdown()


def wait_ready(base: str, timeout: float = 300.0, replicas: int = 1) -> None:
    """Until /healthz says `replicas` replicas reported to the central scheduler."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
            r = httpx.get(f"{base}/healthz", timeout=5)
            if r.status_code == 200 and r.json()["replicas"] >= replicas:
                return
        time.sleep(0.5)
    raise TimeoutError(f"{base} not ready within {timeout} s")
