"""The `vllm` command with the CPU build (`engine/vllm_cli.py`): the version lookup finds the installed
build after platform detection, and `vllm serve` gets our replicas' engine settings as flags that
vLLM's own parser reads back. No engine starts here."""

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

from engine.config import EngineConfig
from engine.engine_args import engine_kwargs
from engine.vllm_cli import DISTRIBUTIONS, serve_cli_args

ROOT = Path(__file__).resolve().parent.parent


def _installed_build() -> str:
    for dist in DISTRIBUTIONS:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    raise AssertionError("no vLLM build installed")


def test_vllm_command_reports_the_installed_version():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "engine.vllm_cli", "--version"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == _installed_build()


def test_serve_flags_round_trip_through_vllms_parser():
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    kwargs = engine_kwargs(EngineConfig(model="tiny", max_model_len=1024, kv_cache_memory_bytes=8 << 20,
                                        enable_prefix_caching=False))
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(serve_cli_args(kwargs))
    assert args.model_tag == kwargs["model"] and args.served_model_name == kwargs["served_model_name"]
    for key in ("max_model_len", "kv_cache_memory_bytes", "dtype", "max_num_seqs", "enforce_eager",
                "distributed_executor_backend", "enable_prefix_caching", "async_scheduling", "block_size"):
        assert getattr(args, key) == kwargs[key], key
