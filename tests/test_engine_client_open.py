"""The ingress's `EngineClient.open` when its caller is cut off while the replica opens the session
(a client disconnect): the open that reached the replica is closed there again, not left to the
replica's idle TTL. Stand-ins for the Serve handle and the central actor (the logic above them)."""

import asyncio

from pipeline.client import EngineClient


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
    def __init__(self):
        self.released = []
        self.batch = _Method(self._batch)

    async def _batch(self, releases, asks, *slot_traffic):
        self.released += [sid for sid, _ in releases]
        return {"decisions": [{"replica_id": "r1"} for _ in asks], "slots": {}, "slot_s": 2.0, "closed": []}


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
