"""Locust users for the soak test (`python -m bench.soak` runs them; see its docstring).

A mixed workload against the HTTP API, as clients use it:
- RagUser: POST /v1/rag with inline documents, the answer streamed as SSE (streamed RAG);
- StreamingInputUser: open a session, append chunks (sequence numbers), finish and read the SSE
  answer; some clients disconnect: before finishing (the session is left to its TTL or deleted),
  or mid-answer (the connection is dropped after the first token);
- ChatUser: OpenAI-compatible chat completions, streamed and not.
Each request is reported under a stable name; an outcome that is not the documented success is a
failure whose message names its kind (`http 429`, `sse error event`, `no final event`, ...).
Run by locust in its own process (it patches the standard library with gevent on import).
"""

from __future__ import annotations

import json
import os
import random

from locust import HttpUser, between, task

MAX_TOKENS = int(os.environ.get("SOAK_MAX_TOKENS", "12"))
DISCONNECT = float(os.environ.get("SOAK_DISCONNECT", "0.2"))  # share of streaming-input clients that leave
WORDS = "retrieval stream context answer replica cache block prefix token chunk search crawl".split()


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def _sse_events(lines):
    """(event, data) of SSE lines, lazily (a caller may stop reading early)."""
    name = None
    for raw in lines:
        line = raw.decode() if isinstance(raw, bytes) else raw
        if line.startswith("event: "):
            name = line[len("event: "):]
        elif line.startswith("data: ") and name is not None:
            yield name, json.loads(line[len("data: "):])
            name = None


def _judge_sse(response) -> None:
    """Mark a streamed answer failed unless it ends with a final event and carries no error event."""
    if response.status_code != 200:
        response.failure(f"http {response.status_code}")
        return
    names = [name for name, _ in _sse_events(response.text.splitlines())]
    if "error" in names:
        response.failure("sse error event")
    elif "final" not in names:
        response.failure("no final event")
    else:
        response.success()


class _User(HttpUser):
    abstract = True
    wait_time = between(0.2, 1.0)

    def on_start(self):
        self.rng = random.Random()


class RagUser(_User):
    weight = 3

    @task
    def streamed_rag(self):
        body = {"question": "Which words come first?", "stream": True, "sampling": {"max_tokens": MAX_TOKENS},
                "source": {"type": "documents", "documents": [_text(self.rng, 60) for _ in range(3)]}}
        with self.client.post("/v1/rag", json=body, name="rag (streamed)", catch_response=True) as response:
            _judge_sse(response)


class StreamingInputUser(_User):
    weight = 3

    @task
    def session(self):
        opened = self.client.post("/v1/streams", json={}, name="streams: open")
        if opened.status_code != 201:
            return
        sid = opened.json()["session_id"]
        for seq in range(self.rng.randint(1, 4)):
            with self.client.post(f"/v1/streams/{sid}/chunks", json={"text": _text(self.rng, 50), "seq": seq},
                                  name="streams: append", catch_response=True) as response:
                if response.status_code != 200:
                    response.failure(f"http {response.status_code}")
                    return
        leave = self.rng.random()
        if leave < DISCONNECT / 2:  # leaves before finishing: half delete, half just go away (TTL)
            if self.rng.random() < 0.5:
                self.client.delete(f"/v1/streams/{sid}", name="streams: delete")
            return
        body = {"question": "Which words come first?", "stream": True, "sampling": {"max_tokens": MAX_TOKENS}}
        if leave < DISCONNECT:  # disconnects mid-answer: reads the first token, drops the connection
            with self.client.post(f"/v1/streams/{sid}/finish", json=body, name="streams: finish (disconnects)",
                                  stream=True, catch_response=True) as response:
                if response.status_code != 200:
                    response.failure(f"http {response.status_code}")
                elif any(name == "token" for name, _ in _sse_events(response.iter_lines())):
                    response.success()
                else:
                    response.failure("no token before disconnect")
                response.close()  # drops the connection mid-answer
            return
        with self.client.post(f"/v1/streams/{sid}/finish", json=body, name="streams: finish",
                              catch_response=True) as response:
            _judge_sse(response)


class ChatUser(_User):
    weight = 2

    def on_start(self):
        super().on_start()
        self.model = self.client.get("/v1/models", name="models").json()["data"][0]["id"]  # the served name

    @task
    def chat(self):
        stream = self.rng.random() < 0.5
        body = {"model": self.model, "messages": [{"role": "user", "content": _text(self.rng, 30)}],
                "max_tokens": MAX_TOKENS, "temperature": 0.0, "stream": stream}
        name = "chat (streamed)" if stream else "chat"
        with self.client.post("/v1/chat/completions", json=body, name=name, catch_response=True) as response:
            if response.status_code != 200:
                response.failure(f"http {response.status_code}")
            elif stream and "data: [DONE]" not in (response.text or ""):
                response.failure("no [DONE]")
            elif not stream and not response.json().get("choices"):
                response.failure("no choices")
            else:
                response.success()
