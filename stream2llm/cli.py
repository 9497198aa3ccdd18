"""The `stream2llm` command. Each subcommand lives with the package it belongs to.

A subcommand module exposes `add_arguments(parser)` and `run(args) -> int`; modules are imported
only when their subcommand runs, so `stream2llm --help` stays fast and needs no vLLM.
"""

import argparse
import importlib
import importlib.util
import sys

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "prepare": ("engine.models", "convert/build the offline models into the cache folder"),
    "demo": ("pipeline.run.demo", "the main job: grounded questions through the Ray Serve app, streamed vs one-shot"),
    "engine-demo": ("engine.demo", "stream Wikipedia summaries straight into the engine and compare TTFT"),
}


def _optional_subcommands() -> None:
    """Subcommands owned by other packages; listed here so `--help` shows them."""
    extra = {
        "sim": ("scheduler.cli_sim", "discrete-event simulation of scheduling policies"),
        "calibrate": ("engine.calibrate", "measure recompute latency and write a cost model"),
        "serve": ("pipeline.run.serve", "run the Ray Serve application"),
        "index": ("retrievers.cli_index", "build the FAISS index over the corpus"),
    }
    for name, (module, help_text) in extra.items():
        if importlib.util.find_spec(module.split(".")[0]) and _module_exists(module):
            SUBCOMMANDS.setdefault(name, (module, help_text))


def _module_exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def main(argv: list[str] | None = None) -> int:
    _optional_subcommands()
    parser = argparse.ArgumentParser(prog="stream2llm", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    argv = sys.argv[1:] if argv is None else argv
    chosen = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    for name, (module, help_text) in SUBCOMMANDS.items():
        sub = subparsers.add_parser(name, help=help_text)
        if name == chosen:
            loaded = importlib.import_module(module)
            loaded.add_arguments(sub)
            sub.set_defaults(_run=loaded.run)
    args = parser.parse_args(argv)
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
