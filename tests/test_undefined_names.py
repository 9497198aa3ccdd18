"""No name is used that is not defined (pyflakes' undefined-name checks over the whole project).

A rename that misses a use only fails when that line runs; benchmark scripts run rarely, and two of
them (`bench.engine_ttft`, `bench.engine_policies`) carried such a miss unnoticed. Unused imports and
style are not checked here.
"""

from pathlib import Path

from pyflakes import api, messages

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("bench", "engine", "pipeline", "retrievers", "scheduler", "stream2llm", "tests", "scripts")
UNDEFINED = (messages.UndefinedName, messages.UndefinedLocal, messages.UndefinedExport)


class _Collect:
    def __init__(self):
        self.found: list[str] = []

    def flake(self, message):
        if isinstance(message, UNDEFINED):
            self.found.append(str(message))

    def unexpectedError(self, filename, msg):
        self.found.append(f"{filename}: {msg}")

    def syntaxError(self, filename, msg, lineno, offset, text):
        self.found.append(f"{filename}:{lineno}: {msg}")


def test_no_undefined_names():
    collect = _Collect()
    files = [p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))]
    assert len(files) > 100  # the project's files were found
    for path in files:
        api.checkPath(str(path), collect)
    assert collect.found == []
