"""The session shards' journal (`pipeline.sessions.journal`) on its own: SQLite files in a temporary
folder, no Ray. A shard restarted by Ray reloads it: `test_central_actor.py` kills a real one."""

import os
import time

from pipeline.sessions.journal import STALE_JOURNAL_S, SessionJournal, apply_change
from stream2llm.data.traces import ContextOp


def _record(session_id: str) -> dict:
    return {"session_id": session_id, "source_type": "client", "replica_id": "r1", "node_id": "n1",
            "context_tokens": 0, "recovered": 0, "last_seq": -1, "created_at": time.time(),
            "ops": [(ContextOp.APPEND, "first")], "sources": [{"title": "a"}]}


def _changes():
    """Appends, a replace (which resets the citations), a claimed sequence number and a field change."""
    return [((ContextOp.APPEND, "second"), [{"title": "b"}], {"context_tokens": 12, "last_seq": 0}, True),
            (None, None, {"last_seq": 1}, False),
            ((ContextOp.REPLACE, "fresh"), [{"title": "c"}], {"context_tokens": 5, "last_seq": 1}, True),
            ((ContextOp.APPEND, "more"), [{"title": "d"}], {"replica_id": "r2", "recovered": 1}, True)]


def test_a_reopened_journal_replays_every_change_to_the_live_record(tmp_path):
    path = tmp_path / "shard.sqlite3"
    journal, live = SessionJournal(path), _record("s1")
    journal.created(dict(live, ops=list(live["ops"])))
    for op, sources, fields, touches in _changes():
        journal.changed("s1", op, sources, fields, touches)
        apply_change(live, op, sources, fields)
    journal.created(_record("s2"))
    journal.finished("s2")
    journal.close()

    loaded = SessionJournal(path).load(ttl_s=60.0)
    assert loaded.records == {"s1": live}
    assert live["sources"] == [{"title": "c"}, {"title": "d"}] and live["last_seq"] == 1
    assert all(isinstance(kind, ContextOp) for kind, _ in loaded.records["s1"]["ops"])
    assert set(loaded.finished_ago_s) == {"s2"} and 0 <= loaded.idle_s["s1"] < 60


def test_a_recreated_session_does_not_inherit_the_old_changes(tmp_path):
    journal = SessionJournal(tmp_path / "shard.sqlite3")
    journal.created(_record("s1"))
    journal.changed("s1", (ContextOp.APPEND, "old"), None, {}, True)
    journal.created(_record("s1"))
    assert SessionJournal(journal.path).load(60.0).records["s1"]["ops"] == [(ContextOp.APPEND, "first")]


def test_what_idled_past_the_ttl_is_dropped_on_load_and_from_the_file(tmp_path):
    now = [1_000_000.0]  # the journal's clock, moved by the test: no sleep, no race with the TTL
    journal = SessionJournal(tmp_path / "shard.sqlite3", clock=lambda: now[0])
    journal.created(_record("idle"))
    journal.changed("idle", None, None, {"last_seq": 3}, touches=False)  # a claim is no activity
    journal.created(_record("finished"))
    journal.finished("finished")
    journal.created(_record("dropped"))
    journal.dropped("dropped")
    journal.created(_record("touched"))
    now[0] += 10.0
    journal.changed("touched", (ContextOp.APPEND, "late"), None, {}, touches=True)  # activity restarts it
    now[0] += 0.5
    journal.created(_record("active"))
    now[0] += 0.5
    loaded = journal.load(ttl_s=5.0)
    assert set(loaded.records) == {"active", "touched"} and not loaded.finished_ago_s
    assert loaded.idle_s == {"active": 0.5, "touched": 1.0}
    again = SessionJournal(journal.path, clock=lambda: now[0]).load(ttl_s=60.0)  # gone from the file
    assert set(again.records) == {"active", "touched"} and not again.finished_ago_s


def test_settings_persist(tmp_path):
    journal = SessionJournal(tmp_path / "shard.sqlite3")
    assert journal.setting("ttl_s", 300.0) == 300.0
    journal.set_setting("ttl_s", 5.0)
    assert SessionJournal(journal.path).setting("ttl_s", 300.0) == 5.0


def test_opening_a_shard_journal_removes_only_other_clusters_stale_folders(tmp_path):
    stale, recent = tmp_path / "old-node", tmp_path / "live-node"
    for folder in (stale, recent):
        SessionJournal(folder / "x.sqlite3").close()
    old = time.time() - STALE_JOURNAL_S - 60
    for f in stale.iterdir():
        os.utime(f, (old, old))
    journal = SessionJournal.for_shard("x", "this-node", root=tmp_path)
    assert journal.path == tmp_path / "this-node" / "x.sqlite3"
    assert not stale.exists() and recent.is_dir()
