"""No name used that is not defined, no import left unused (pyflakes over the whole project).

A rename that misses a use only fails when that line runs; benchmark scripts run rarely, and two of
them (`bench.engine_ttft`, `bench.engine_policies`) carried such a miss unnoticed. An unused import
is where such a rename starts (the old name lingers). An import kept on purpose (a pytest fixture,
a re-export, a module imported for its side effect) carries a `noqa` comment saying why; style is
not checked here.
"""

from pathlib import Path

from pyflakes import api, messages

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("bench", "engine", "pipeline", "retrievers", "scheduler", "stream2llm", "tests", "scripts")
UNDEFINED = (messages.UndefinedName, messages.UndefinedLocal, messages.UndefinedExport)
UNUSED = (messages.UnusedImport, messages.RedefinedWhileUnused)


def _import_line(message) -> int:
    """The line of the import a message is about: a redefinition names the original's line."""
    if isinstance(message, messages.RedefinedWhileUnused):
        return message.message_args[1]
    return message.lineno


class _Collect:
    def __init__(self):
        self.found: list[str] = []
        self._lines: dict[str, list[str]] = {}

    def flake(self, message):
        if isinstance(message, UNDEFINED):
            self.found.append(str(message))
        elif isinstance(message, UNUSED) and "noqa" not in self._line(message.filename, _import_line(message)):
            self.found.append(str(message))

    def _line(self, filename: str, lineno: int) -> str:
        if filename not in self._lines:
            self._lines[filename] = Path(filename).read_text().splitlines()
        return self._lines[filename][lineno - 1]

    def unexpectedError(self, filename, msg):
        self.found.append(f"{filename}: {msg}")

    def syntaxError(self, filename, msg, lineno, offset, text):
        self.found.append(f"{filename}:{lineno}: {msg}")


def test_no_undefined_names_or_unused_imports():
    collect = _Collect()
    files = [p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))]
    assert len(files) > 100  # the project's files were found
    for path in files:
        api.checkPath(str(path), collect)
    assert collect.found == []


def test_an_unused_import_is_reported(tmp_path):
    source = tmp_path / "sample.py"
    source.write_text("import json\nimport os  # noqa: F401 (kept on purpose)\n")
    collect = _Collect()
    api.checkPath(str(source), collect)
    assert collect.found == [f"{source}:1:1: 'json' imported but unused"]
