"""A session shard's records on its node's disk, so that a restarted shard actor resumes them.

A `SessionShard` writes every change through its journal before the call returns: the record as
created, then each later change as an event (a context op with its citations and fields, or a
claimed client sequence number) that `apply_change` replays on load, the same function the live
path applies. SQLite in WAL mode with `synchronous=NORMAL`: a write appends to the log without an
fsync, so it outlives the shard's process (what the journal is for) though not a power loss of the
node; the shards run on the head node, whose loss ends the Ray cluster anyway (without GCS fault
tolerance). One file per shard in a folder named by the node's id, which a new Ray cluster does
not share: a restarted shard finds its own records, a new cluster starts clean. Records and
finished marks idle past the session TTL are dropped on load as they are live; folders of other
clusters untouched for `STALE_JOURNAL_S` are removed when a shard opens its journal.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from stream2llm.data.traces import ContextOp

JOURNAL_ROOT = Path(tempfile.gettempdir()) / "stream2llm-sessions"
STALE_JOURNAL_S = 24 * 3600.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (session_id TEXT PRIMARY KEY, body TEXT NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS changes (n INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL,
                                    body TEXT NOT NULL, touches INTEGER NOT NULL, at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS changes_by_session ON changes (session_id);
CREATE TABLE IF NOT EXISTS finished (session_id TEXT PRIMARY KEY, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS settings (name TEXT PRIMARY KEY, value REAL NOT NULL);
"""


def apply_change(record: dict, op, sources: list[dict] | None, fields: dict) -> None:
    """One accepted change on a record: `op` is logged, `sources` are its citations (a replace
    resets them), `fields` overwrite."""
    if op is not None:
        record["ops"].append(op)
    if sources is not None:
        record["sources"] = sources if op and op[0] == ContextOp.REPLACE else record["sources"] + sources
    record.update(fields)


@dataclass
class Loaded:
    """What a journal held: records and, per session, seconds since its last activity / finish."""

    records: dict[str, dict] = field(default_factory=dict)
    idle_s: dict[str, float] = field(default_factory=dict)
    finished_ago_s: dict[str, float] = field(default_factory=dict)


class SessionJournal:
    def __init__(self, path: Path, clock: Callable[[], float] = time.time):
        """`clock`: wall-clock seconds, stamped on every write and read by `load` (the file outlives
        the process, so not a monotonic clock)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._clock = clock
        self._db = sqlite3.connect(path, isolation_level=None)  # autocommit: one statement, one write
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)

    @classmethod
    def for_shard(cls, shard_name: str, node_id: str, root: Path = JOURNAL_ROOT) -> SessionJournal:
        _remove_stale(root, keep=node_id)
        return cls(root / node_id / f"{shard_name}.sqlite3")

    def setting(self, name: str, default: float) -> float:
        row = self._db.execute("SELECT value FROM settings WHERE name = ?", (name,)).fetchone()
        return row[0] if row else default

    def set_setting(self, name: str, value: float) -> None:
        self._db.execute("INSERT OR REPLACE INTO settings VALUES (?, ?)", (name, value))

    def created(self, record: dict) -> None:
        with self._db:  # a re-created id starts over: its old changes go with the old record
            self._db.execute("BEGIN")
            self._db.execute("DELETE FROM changes WHERE session_id = ?", (record["session_id"],))
            self._db.execute("INSERT OR REPLACE INTO records VALUES (?, ?, ?)",
                             (record["session_id"], json.dumps(record), self._clock()))

    def changed(self, session_id: str, op, sources: list[dict] | None, fields: dict, touches: bool) -> None:
        self._db.execute("INSERT INTO changes (session_id, body, touches, at) VALUES (?, ?, ?, ?)",
                         (session_id, json.dumps([op, sources, fields]), int(touches), self._clock()))

    def finished(self, session_id: str) -> None:
        with self._db:
            self._db.execute("BEGIN")
            self._forget(session_id)
            self._db.execute("INSERT OR REPLACE INTO finished VALUES (?, ?)", (session_id, self._clock()))

    def dropped(self, session_id: str) -> None:
        with self._db:
            self._db.execute("BEGIN")
            self._forget(session_id)

    def unfinished(self, session_id: str) -> None:
        """The finished mark expired."""
        self._db.execute("DELETE FROM finished WHERE session_id = ?", (session_id,))

    def _forget(self, session_id: str) -> None:
        self._db.execute("DELETE FROM records WHERE session_id = ?", (session_id,))
        self._db.execute("DELETE FROM changes WHERE session_id = ?", (session_id,))

    def load(self, ttl_s: float) -> Loaded:
        """Every record with its changes replayed; what idled past `ttl_s` is dropped, not loaded."""
        now, loaded = self._clock(), Loaded()
        for session_id, body, at in self._db.execute("SELECT session_id, body, at FROM records"):
            record = json.loads(body)
            record["ops"] = [(ContextOp(kind), text) for kind, text in record["ops"]]
            loaded.records[session_id], loaded.idle_s[session_id] = record, now - at
        rows = self._db.execute("SELECT session_id, body, touches, at FROM changes ORDER BY n")
        for session_id, body, touches, at in rows:
            record = loaded.records.get(session_id)
            if record is None:
                continue
            op, sources, fields = json.loads(body)
            apply_change(record, (ContextOp(op[0]), op[1]) if op else None, sources, fields)
            if touches:
                loaded.idle_s[session_id] = now - at
        for session_id, at in self._db.execute("SELECT session_id, at FROM finished").fetchall():
            loaded.finished_ago_s[session_id] = now - at
        for session_id in [s for s, idle in loaded.idle_s.items() if idle > ttl_s]:
            self.dropped(session_id)
            del loaded.records[session_id], loaded.idle_s[session_id]
        for session_id in [s for s, ago in loaded.finished_ago_s.items() if ago > ttl_s]:
            self.unfinished(session_id)
            del loaded.finished_ago_s[session_id]
        return loaded

    def close(self) -> None:
        self._db.close()


def _remove_stale(root: Path, keep: str) -> None:
    """Remove journal folders of other Ray clusters that nothing wrote to for STALE_JOURNAL_S."""
    if not root.is_dir():
        return
    cutoff = time.time() - STALE_JOURNAL_S
    for folder in root.iterdir():
        if folder.name == keep or not folder.is_dir():
            continue
        try:
            newest = max((f.stat().st_mtime for f in folder.iterdir()), default=folder.stat().st_mtime)
        except OSError:
            continue  # another shard removed it meanwhile
        if newest < cutoff:
            shutil.rmtree(folder, ignore_errors=True)
