"""One-shot (OpenAI) admission at the ingress: a prompt that can never fit is refused at once, and
an estimate alone never refuses one that fits. The replica's tokenizer and the central actor are
stand-ins behind their call interfaces (the HTTP path runs in tests/test_pipeline_admission_http.py)."""

import asyncio
import math

import pytest

from pipeline.errors import AdmissionRejected, NeverFits, ReplicaNotReady, http_status, openai_error
from pipeline.ingress.replica_client import CHARS_PER_TOKEN, EngineClient

LIMIT = 2048


class _Remote:
    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    async def remote(self, *args, **kw):
        self.calls += 1
        return self.fn(*args, **kw)


class _Handle:
    def __init__(self, tokens: int):
        self.tokenize = _Remote(lambda text: list(range(tokens)))


class _Central:
    def __init__(self, decision: dict):
        self.asked: list[int] = []
        self.decision = decision

    async def admit_request(self, request_id, tokens, timeout_s):
        self.asked.append(tokens)
        return self.decision


def client(tokens: int, decision: dict | None = None) -> tuple[EngineClient, _Central]:
    c = EngineClient(_Handle(tokens), None, 1.0, LIMIT - 256, max_model_len=LIMIT)
    c._central = central = _Central(decision or {"replica_id": "r1"})
    return c, central


def test_a_short_prompt_is_admitted_on_its_estimate_without_counting():
    c, central = client(tokens=5)
    assert asyncio.run(c.admit_request("q", "Hello there", 16)) == "r1"
    assert central.asked == [math.ceil(len("Hello there") / CHARS_PER_TOKEN) + 16]
    assert c._handle.tokenize.calls == 0


def test_the_lease_follows_the_counts_replicas_sent_back():
    c, central = client(tokens=5)
    prompt = "capital " * 100  # 800 characters, 100 tokens as the replica counted them
    for _ in range(3):
        c.prompt_estimate("completion").observe(len(prompt), 100)
    asyncio.run(c.admit_request("q", prompt, 16))
    asyncio.run(c.admit_request("q2", prompt, 16, kind="chat"))  # chat keeps its own count
    assert central.asked == [100 + 16, math.ceil(800 / CHARS_PER_TOKEN) + 16]
    assert c._handle.tokenize.calls == 0


def test_an_estimate_over_the_length_is_counted_before_refusing():
    text = "x" * (LIMIT * CHARS_PER_TOKEN)
    c, central = client(tokens=300)  # few tokens for many characters: it fits
    assert asyncio.run(c.admit_request("q", text, 16)) == "r1"
    assert central.asked == [316] and c._handle.tokenize.calls == 1
    c, central = client(tokens=LIMIT)
    with pytest.raises(NeverFits) as e:
        asyncio.run(c.admit_request("q", text, 16))
    assert central.asked == []  # refused at once: never queued
    assert http_status(e.value) == 400 and openai_error(e.value)["error"]["code"] == "context_length_exceeded"


@pytest.mark.parametrize("decision, error, status", [
    ({"never_fits": "too big"}, NeverFits, 400),
    ({"unavailable": "starting", "retry_after_s": 5}, ReplicaNotReady, 503),
    ({"rejected": "full", "retry_after_s": 2}, AdmissionRejected, 429),
])
def test_the_central_decision_becomes_its_typed_error(decision, error, status):
    c, _ = client(tokens=5, decision=decision)
    with pytest.raises(error) as e:
        asyncio.run(c.admit_request("q", "Hi", 4))
    assert http_status(e.value) == status
    assert getattr(e.value, "retry_after_s", None) == decision.get("retry_after_s")


class _Posted:
    def __init__(self):
        self.releases = []

    def release(self, request_id, tokens=None):
        self.releases.append((request_id, tokens))


def test_the_lease_is_released_with_what_the_engine_counted_and_teaches_the_estimate():
    from types import SimpleNamespace

    from engine.api import OpenAITimings
    from pipeline.ingress.openai_routes import _releaser
    from pipeline.schemas import CompletionRequest

    c, _ = client(tokens=5)
    c._central = posted = _Posted()
    ing = SimpleNamespace(client=c)
    body = CompletionRequest(model="m", prompt=["capital " * 100, [1, 2, 3]], max_tokens=8)
    for i in range(3):
        seen, release = _releaser(ing, "completion", body, f"req{i}")
        seen.append(OpenAITimings(output_tokens=8, prompt_tokens=103))  # 100 from the text, 3 ids
        release()
    assert posted.releases == [(f"req{i}", 111) for i in range(3)]
    assert c.prompt_estimate("completion").tokens(len("capital " * 100)) == 100
    seen2, release2 = _releaser(ing, "completion", body, "req2")
    release2()  # cut off before the engine said anything: released without a size
    assert posted.releases[-1] == ("req2", None)
