"""A streaming response whose client disconnects closes its event generators when the call ends,
so their clean-up (abort the session, release its admission) runs then, not at garbage collection."""

import asyncio

from pipeline.ingress.http_util import event_stream


def test_a_cut_client_closes_the_event_generator_at_once():
    cleaned = []

    async def events():
        try:
            n = 0
            while True:
                n += 1
                yield "context", {"n": n}, f"s.c{n}"
        finally:
            cleaned.append("events")  # the flows abort the session here

    async def scenario():
        response = event_stream(events())
        disconnected = asyncio.Event()
        sent = []

        async def receive():
            await disconnected.wait()
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)
            if message["type"] == "http.response.body":
                disconnected.set()          # the client leaves after the first event...
                await asyncio.Event().wait()  # ...while this send waits on its socket

        scope = {"type": "http", "asgi": {"spec_version": "2.3"}, "method": "POST", "path": "/v1/rag",
                 "headers": []}
        await asyncio.wait_for(response(scope, receive, send), timeout=10)
        # the response object (and with it the generators) is still referenced here, and the loop
        # is running (its shutdown would close them): only an explicit close can have cleaned up
        return sent, list(cleaned)

    sent, cleaned_when_the_call_ended = asyncio.run(scenario())
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert cleaned_when_the_call_ended == ["events"]
