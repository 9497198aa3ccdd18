"""The scale-down's session moves (`pipeline.replica.drain.SessionMover`) and the ingress's recovery
beside them (`EngineClient.recover`), with stand-ins for the session store, the central actor and
the Serve handle (the logic above them; tests/test_pipeline_autoscale.py runs the real thing):
- a stopping replica moves the sessions the store holds for it: the chosen replica adopts their
  logged context and the record points there; the ingress's next call goes there, no replay;
- a move that fails (no room; the chosen replica errs; the budget runs out) ends the mark with the
  record unchanged, so the next call replays the session;
- a session the store no longer holds for the replica (finished, moved, a change being applied) is
  left alone.
"""

import asyncio

from engine.api import SessionNotFoundError
from pipeline.ingress.replica_client import EngineClient
from pipeline.replica.drain import SessionMover
from pipeline.sessions.log import SessionLog
from stream2llm.data.traces import ContextOp


class _Method:
    def __init__(self, fn):
        self.remote = fn


class _Store:
    """One record per session and the move mark, as `SessionShard` keeps them (no waiting)."""

    def __init__(self, records: dict[str, SessionLog], changing: set[str] = frozenset()):
        self.records, self.changing, self.moving, self.ended = records, set(changing), set(), []

    async def begin_move(self, session_id, from_replica, yield_to_changes=False):
        log = self.records.get(session_id)
        if log is None or log.replica_id != from_replica or session_id in self.moving:
            return None
        if yield_to_changes and session_id in self.changing:
            return None
        self.moving.add(session_id)
        return SessionLog(log.session_id, log.source_type, log.replica_id, ops=list(log.ops), last_seq=log.last_seq)

    async def end_move(self, log, session_id=""):
        sid = log.session_id if log is not None else session_id
        self.moving.discard(sid)
        self.ended.append((sid, None if log is None else log.replica_id))
        if log is not None:
            self.records[sid].replica_id = log.replica_id
        return True

    async def get(self, session_id, claim_seq=None, for_change=True):
        return self.records[session_id], False


class _Central:
    def __init__(self, room: bool = True):
        self.room, self.moves, self.released = room, [], []
        self.admit = _Method(self._admit)
        self.release = _Method(self.released.append)
        self.note_moves = _Method(self.moves.append)

    async def _admit(self, session_id, source_type, timeout_s, exclude, recovery=False):
        assert recovery and exclude == ["victim"]
        return {"replica_id": "target"} if self.room else {"rejected": "no room", "retry_after_s": 1.0}


class _Replicas:
    """Holds each replica's sessions and their context; `adopt` may fail or never end."""

    def __init__(self, fail: bool = False, hang: bool = False):
        self.context: dict[tuple[str, str], list[str]] = {}
        self.fail, self.hang = fail, hang
        self.adopt = _Method(self._adopt)
        self.change_context = _Method(self._change)
        self.open_session = _Method(self._open)

    async def _adopt(self, session_id, source_type, ops, last_seq, route_to):
        if self.hang:
            await asyncio.Event().wait()
        if self.fail:
            raise RuntimeError("engine error")
        self.context[(route_to, session_id)] = [text for _, text in ops]
        return {"replica_id": route_to, "node_id": "n2", "context_tokens": 7}

    async def _open(self, session_id, source_type, owner, route_to):
        self.context[(route_to, session_id)] = []
        return {"replica_id": route_to, "node_id": "n2"}

    async def _change(self, session_id, op, text, *args, route_to):
        if (route_to, session_id) not in self.context:
            raise SessionNotFoundError(f"session {session_id!r} is not open on replica {route_to}")
        self.context[(route_to, session_id)].append(text)
        return len(self.context[(route_to, session_id)])


def _session(sid: str, replica: str = "victim") -> SessionLog:
    log = SessionLog(sid, "client", replica)
    log.ops = [(ContextOp.APPEND, "a "), (ContextOp.REPLACE, "b "), (ContextOp.APPEND, "c")]
    return log


def test_a_stopping_replica_moves_its_sessions_and_the_next_call_goes_there_without_replay():
    store = _Store({"s1": _session("s1"), "s2": _session("s2"), "other": _session("other", "elsewhere")})
    central, replicas = _Central(), _Replicas()
    mover = SessionMover("victim", store, central, replicas, budget_s=30.0)
    outcomes = asyncio.run(mover.move_all(["s1", "s2", "other"]))
    assert outcomes == {"moved": 2, "not_held": 1}
    assert replicas.context[("target", "s1")] == ["b ", "c"]  # from the last replace on, in order
    assert store.records["s1"].replica_id == "target" and not store.moving

    # the ingress still holds the old replica; its call fails there and finds the moved session
    client = EngineClient(replicas, _Central(), admission_timeout_s=1.0, context_limit=100, sessions=store)
    session = _session("s1")
    tokens = asyncio.run(client.add(session, ContextOp.APPEND, "d"))
    assert tokens == 3 and replicas.context[("target", "s1")] == ["b ", "c", "d"]
    assert session.replica_id == "target" and session.recovered == 0


def test_failed_moves_leave_the_record_and_the_next_call_replays():
    for central, replicas, budget in ((_Central(room=False), _Replicas(), 30.0), (_Central(), _Replicas(fail=True), 30.0),
                                      (_Central(), _Replicas(hang=True), 0.2)):
        store = _Store({"s1": _session("s1")})
        outcomes = asyncio.run(SessionMover("victim", store, central, replicas, budget_s=budget).move_all(["s1"]))
        assert outcomes == {"move_failed": 1}
        assert store.ended == [("s1", None)] and store.records["s1"].replica_id == "victim" and not store.moving


def test_the_ingress_replays_a_session_nobody_moved_under_the_move_mark():
    store = _Store({"s1": _session("s1")})
    central, replicas = _Central(), _Replicas()
    central.batch = _Method(lambda releases, asks, *rest: _decide(asks))
    client = EngineClient(replicas, central, admission_timeout_s=1.0, context_limit=100, sessions=store)
    session = _session("s1")
    asyncio.run(client.recover(session, dead=False))
    assert session.recovered == 1 and replicas.context[("target", "s1")] == ["b ", "c"]
    assert store.ended == [("s1", "target")] and central.moves == [{"replayed": 1}]


def test_a_session_being_changed_is_left_to_its_ingress():
    store = _Store({"s1": _session("s1")}, changing={"s1"})
    outcomes = asyncio.run(SessionMover("victim", store, _Central(), _Replicas(), budget_s=30.0).move_all(["s1"]))
    assert outcomes == {"not_held": 1} and store.records["s1"].replica_id == "victim"


async def _decide(asks):
    return {"decisions": [{"replica_id": "target"} for _ in asks], "slots": {}, "slot_s": 2.0, "closed": []}
