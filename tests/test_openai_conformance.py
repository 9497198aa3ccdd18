"""The OpenAI routes with the clients users have: the official `openai` package and `vllm bench serve`,
against the live app (Ray Serve, SmolLM2, HTTP on loopback). vLLM's own serving layer answers on the
replicas, so stop strings, logprobs, n, multi-part content, token-id prompts and usage in streams
work as in `vllm serve`; our admission and routing stay in front. The Grafana dashboard's metrics
are checked against the same app's /metrics.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from pipeline_fixtures import REPO, serve_app

pytestmark = [pytest.mark.timeout(900), pytest.mark.random_order(disabled=True)]
MODEL = "stream2llm"
MAX_MODEL_LEN = 2048
DASHBOARD = Path(REPO) / "deploy" / "grafana" / "stream2llm.json"
CONFIG = {
    "model": {"model": "smollm2", "max_model_len": MAX_MODEL_LEN, "kv_cache_memory_bytes": 256 << 20},
    "replicas": {"min_replicas": 1, "max_replicas": 1, "num_cpus": 1.0, "report_interval_s": 0.5},
    "retrievers": {"warm_pools": False},  # the OpenAI routes only: no retriever actors
}


@pytest.fixture(scope="module")
def base():
    with serve_app(CONFIG) as url:
        yield url


@pytest.fixture(scope="module")
def client(base):
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", timeout=120, max_retries=0)


def _stop_inside(text: str) -> str:
    """A stop string that the greedy answer `text` holds after its start."""
    words = [w for w in text.split()[1:] if w.strip(".,!?")]
    stop = words[0] if words else text[len(text) // 2:len(text) // 2 + 2]
    assert stop.strip() and text.index(stop) > 0, text
    return stop


def test_models(client):
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_completion_usage_stop_and_stream(client):
    prompt = "The capital of France is Paris. The capital of Italy is"
    whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
    text = whole.choices[0].text
    assert whole.usage.prompt_tokens > 5 and whole.usage.completion_tokens == 12
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + 12 and whole.choices[0].finish_reason == "length"

    stop = _stop_inside(text)
    stopped = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0, stop=[stop])
    assert stopped.choices[0].text == text[:text.index(stop)] and stopped.choices[0].finish_reason == "stop"

    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12


def test_completion_token_ids_n_and_logprobs(client):
    ids = client.completions.create(model=MODEL, prompt="Hello", max_tokens=1, echo=True, logprobs=0)
    assert ids.usage.prompt_tokens >= 1
    r = client.completions.create(model=MODEL, prompt=[504, 3458, 282], max_tokens=4, n=2, logprobs=2, seed=3,
                                  temperature=1.0)
    assert r.usage.prompt_tokens == 3 and [c.index for c in r.choices] == [0, 1]
    for choice in r.choices:
        assert len(choice.logprobs.tokens) == len(choice.logprobs.top_logprobs) >= 1
        assert all(1 <= len(top) <= 3 for top in choice.logprobs.top_logprobs)


def test_chat_multipart_content_streaming_and_not(client):
    messages = [{"role": "system", "content": "You answer in one word."},
                {"role": "user", "content": [{"type": "text", "text": "What is the capital of France?"}]}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=8, temperature=0)
    answer = whole.choices[0].message
    assert answer.role == "assistant" and "Paris" in answer.content
    assert whole.usage.completion_tokens <= 8 and whole.usage.prompt_tokens > 10

    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=8,
                                                 temperature=0, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].object == "chat.completion.chunk" and chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == answer.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_chat_logprobs_and_stop(client):
    messages = [{"role": "user", "content": "Count: one, two, three, four, five"}]
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6, temperature=0, logprobs=True,
                                       top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens and all(len(t.top_logprobs) == 2 for t in content)
    text = r.choices[0].message.content
    stop = _stop_inside(text)
    s = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6, temperature=0, stop=[stop])
    assert s.choices[0].message.content == text[:text.index(stop)] and s.choices[0].finish_reason == "stop"


def test_structured_outputs(client):
    question = [{"role": "user", "content": "Is Paris in France?"}]
    r = client.chat.completions.create(model=MODEL, messages=question, max_tokens=5, temperature=0,
                                       extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
    assert r.choices[0].message.content in {"yes", "no"}


def test_errors_are_openai_errors(client, base):
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="nope", prompt="Hi", max_tokens=2)
    assert e.value.status_code == 404 and e.value.code == "model_not_found"

    with pytest.raises(openai.BadRequestError) as e:  # vLLM's own length check, on the replica
        client.completions.create(model=MODEL, prompt=[504] * (MAX_MODEL_LEN + 10), max_tokens=2)
    assert e.value.code == "context_length_exceeded" and str(MAX_MODEL_LEN) in e.value.message
    with pytest.raises(openai.BadRequestError) as e:  # no prompt could fit: refused at the door
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                       max_tokens=MAX_MODEL_LEN + 1)
    assert e.value.code == "context_length_exceeded"

    with pytest.raises(openai.BadRequestError) as e:  # accepted and ignored would be a silent bug
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
                                       extra_body={"frobnicate": True})
    assert e.value.param == "frobnicate" and "frobnicate" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:  # a type vLLM's request model refuses
        client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, extra_body={"top_k": "many"})
    assert "top_k" in e.value.message

    r = httpx.post(f"{base}/v1/chat/completions", timeout=30, json={"model": MODEL, "messages": "not a list"})
    assert r.status_code == 400 and set(r.json()["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("backend,endpoint", [("openai-chat", "/v1/chat/completions"), ("openai", "/v1/completions")])
def test_vllm_bench_serve(base, tmp_path, backend, endpoint):
    """vLLM's own benchmark client against the app: every request succeeds."""
    from engine.models import resolve_model

    cmd = [sys.executable, "-m", "engine.vllm_cli", "bench", "serve", "--backend", backend, "--base-url", base,
           "--endpoint", endpoint, "--model", MODEL, "--tokenizer", resolve_model("smollm2"),
           "--dataset-name", "random", "--random-input-len", "64", "--random-output-len", "8", "--num-prompts", "6",
           "--request-rate", "4", "--seed", "1", "--disable-tqdm", "--save-result", "--result-dir", str(tmp_path),
           "--result-filename", "bench.json", "--ready-check-timeout-sec", "0"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    run = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads((tmp_path / "bench.json").read_text())
    assert result["completed"] == 6 and result["failed"] == 0, result
    assert result["total_output_tokens"] > 0 and result["median_ttft_ms"] > 0


def test_dashboard_metrics_exist_in_metrics(base, client):
    """Every metric a Grafana panel queries is served by /metrics (after traffic on both OpenAI routes)."""
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=3)
    served = {line.split("{")[0].split(" ")[0] for line in httpx.get(f"{base}/metrics", timeout=30).text.splitlines()
              if line and not line.startswith("#")}
    panels = json.loads(DASHBOARD.read_text())["panels"]
    assert len(panels) >= 8
    for panel in panels:
        names = {n for t in panel["targets"] for n in re.findall(r"\bstream2llm_[a-z_]+", t["expr"])}
        assert names, panel["title"]
        missing = names - served
        assert not missing, (panel["title"], missing)
    assert Path(DASHBOARD.parent / "prometheus.yml").read_text().count("/metrics") >= 1


def test_refused_admission_is_a_429_with_retry_after(client, base):
    """No replica has room: the official client raises RateLimitError, with a Retry-After header its
    own retries honour. Last in the module: it fills the replica's projected budget, then frees it."""
    opened = []
    try:
        while len(opened) < 64:  # each client session reserves its type's 2,048-token prior
            r = httpx.post(f"{base}/v1/streams", json={"source_type": "client"}, timeout=60)
            if r.status_code != 201:
                break
            opened.append(r.json()["session_id"])
        assert r.status_code == 429 and opened, r.text
        with pytest.raises(openai.RateLimitError) as e:  # as large as that prior: it cannot fit either
            client.completions.create(model=MODEL, prompt=[504] * 8, max_tokens=MAX_MODEL_LEN - 8)
        assert e.value.code == "rate_limit_exceeded"
        assert int(e.value.response.headers["retry-after"]) >= 1
    finally:
        for sid in opened:
            httpx.delete(f"{base}/v1/streams/{sid}", timeout=30)
