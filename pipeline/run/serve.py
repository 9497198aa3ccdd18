"""`stream2llm serve`: start (or join) Ray, deploy the application, serve until interrupted.

    stream2llm serve                                  # local Ray, CPU, SmolLM2, 127.0.0.1:8000
    stream2llm serve --set model.model=tiny --set replicas.max_replicas=2
    stream2llm serve --config app.yaml --address auto --host 0.0.0.0   # on a Ray cluster
"""

from __future__ import annotations

import argparse
import os
import time


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML file with an AppConfig (see pipeline/config.py)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config field, e.g. model.model=tiny (repeatable)")
    parser.add_argument("--address", default=None, help="Ray address (default: start local Ray)")
    parser.add_argument("--host", default="127.0.0.1", help="HTTP host (default loopback only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--print-config", action="store_true", help="print the config and exit")


def parse_overrides(pairs: list[str]) -> dict:
    import yaml

    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set expects KEY=VALUE, got {pair!r}")
        out[key.strip()] = yaml.safe_load(value)
    return out


def run(args: argparse.Namespace) -> int:
    from pipeline.config import load_config

    config = load_config(args.config, parse_overrides(args.set))
    if args.print_config:
        print(config.model_dump_json(indent=2))
        return 0
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import ray
    from ray import serve

    from pipeline.app import build_app

    ray.init(address=args.address)
    serve.start(http_options={"host": args.host, "port": args.port})
    serve.run(build_app(config), name=config.name, route_prefix=config.route_prefix)
    print(f"stream2llm serving on http://{args.host}:{args.port}{config.route_prefix} (Ctrl-C stops)")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        serve.shutdown()
        ray.shutdown()
    return 0
