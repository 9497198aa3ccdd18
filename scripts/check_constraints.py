"""Fail (exit 1, listing each) when an installed package differs from its pin in a constraints file.

    python scripts/check_constraints.py constraints/cpu.txt

Every `name==version` line must be installed at that version (a local build tag such as `+cpu`
must match too when the pin has one). Run by scripts/setup.sh after installing.
"""

import re
import sys
from importlib import metadata
from pathlib import Path


def pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            if not sep:
                raise SystemExit(f"{path}: not a name==version pin: {line!r}")
            out[_canonical(name)] = version.strip()
    return out


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed() -> dict[str, str]:
    return {_canonical(d.metadata["Name"]): d.version for d in metadata.distributions()}


def mismatches(wanted: dict[str, str], have: dict[str, str]) -> list[str]:
    out = []
    for name, version in sorted(wanted.items()):
        got = have.get(name)
        if got is None:
            out.append(f"{name}: not installed (pinned {version})")
        elif got != version and ("+" in version or got.split("+")[0] != version):
            out.append(f"{name}: {got} installed, {version} pinned")
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    problems = mismatches(pins(Path(argv[0])), installed())
    for p in problems:
        print(f"[setup] pin mismatch: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
