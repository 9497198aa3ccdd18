"""The ingress's `EngineClient` opening sessions, with stand-ins for the Serve handle and the central
actor (the logic above them):
- a caller cut off while the replica opens the session (a client disconnect): the open that reached
  the replica is closed there again, not left to the replica's idle TTL;
- a recovery whose open lands on another replica than the one it was placed on (the router could
  not use a replica just started): the replayed context follows the open (a kill drill failed a
  session on this: the replay went to the placed replica, which answered "not open").
"""

import asyncio

from engine.api import SessionNotFoundError
from pipeline.ingress.replica_client import EngineClient
from pipeline.sessions.log import SessionLog
from stream2llm.data.traces import ContextOp


class _Method:
    def __init__(self, fn):
        self.remote = fn


class _Replica:
    """Opens sessions at once but answers the open only when told to; records aborts."""

    def __init__(self):
        self.open_sessions, self.aborted, self.answer = set(), [], asyncio.Event()
        self.open_session = _Method(self._open)
        self.abort = _Method(self._abort)

    async def _open(self, session_id, source_type, owner, route_to):
        self.open_sessions.add(session_id)  # the replica has opened it...
        await self.answer.wait()            # ...but its answer has not reached the ingress yet
        return {"replica_id": route_to, "node_id": "n"}

    async def _abort(self, session_id, route_to):
        self.aborted.append((session_id, route_to))
        self.open_sessions.discard(session_id)
        return True


class _Central:
    """Places every session on `placed`; records releases."""

    def __init__(self, placed: str = "r1"):
        self.placed, self.released, self.moves = placed, [], []
        self.batch = _Method(self._batch)
        self.note_moves = _Method(self.moves.append)

    async def _batch(self, releases, asks, *slot_traffic):
        self.released += [sid for sid, _ in releases]
        return {"decisions": [{"replica_id": self.placed} for _ in asks], "slots": {}, "slot_s": 2.0, "closed": []}


def test_an_open_cut_short_after_the_replica_opened_is_aborted_there():
    async def scenario():
        replica, central = _Replica(), _Central()
        client = EngineClient(replica, central, admission_timeout_s=1.0, context_limit=100)
        opening = asyncio.create_task(client.open("client"))
        deadline = asyncio.get_running_loop().time() + 30
        while not replica.open_sessions and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        opening.cancel()  # the client went away while the open's answer was on its way
        try:
            await opening
        except asyncio.CancelledError:
            pass
        deadline = asyncio.get_running_loop().time() + 30  # the clean-up runs detached
        while not (replica.aborted and central.released) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        return replica, central

    replica, central = asyncio.run(scenario())
    assert not replica.open_sessions
    (session_id, route_to), = replica.aborted
    assert route_to == "r1" and central.released == [session_id]


class _Replicas:
    """Every open placed on "placed" lands on "other"; context goes only where a session is open."""

    def __init__(self):
        self.opened, self.context = {}, []
        self.open_session = _Method(self._open)
        self.change_context = _Method(self._change)

    async def _open(self, session_id, source_type, owner, route_to):
        landed = "other" if route_to == "placed" else route_to
        self.opened[session_id] = landed
        return {"replica_id": landed, "node_id": "n"}

    async def _change(self, session_id, op, text, route_to):
        if self.opened.get(session_id) != route_to:
            raise SessionNotFoundError(f"session {session_id!r} is not open on replica {route_to}")
        self.context.append((route_to, text))
        return len(self.context)


def test_a_recovery_replays_to_the_replica_its_open_landed_on():
    replicas, central = _Replicas(), _Central(placed="placed")
    client = EngineClient(replicas, central, admission_timeout_s=1.0, context_limit=100)
    session = SessionLog("s1", "client", "lost")
    session.ops = [(ContextOp.APPEND, "first "), (ContextOp.APPEND, "second")]

    async def scenario():
        await client.recover(session, dead=False)
        for _ in range(100):  # the release is batched: let the flush run
            if central.released:
                break
            await asyncio.sleep(0.01)

    asyncio.run(scenario())
    assert session.replica_id == "other" and session.recovered == 1
    assert [where for where, _ in replicas.context] == ["other", "other"]
    assert central.released == ["s1"]  # the placement on "placed" is given back; "other" adopts it
    assert central.moves == [{"replayed": 1}]
