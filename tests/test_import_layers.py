"""The package layers point down only (docs/ARCHITECTURE.md, "Layers"): the import-linter contracts
in pyproject.toml, run as a test so that an upward import fails the suite."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_import_contracts_are_kept():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if lint is None:
        pytest.fail("import-linter is not installed: it is a dev dependency (scripts/setup.sh installs it)")
    result = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "BROKEN" not in result.stdout and "KEPT" in result.stdout
