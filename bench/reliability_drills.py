"""The parts of `bench.reliability` that act on one session or on the cluster, and the summary.

- `send_session`: one open-loop /v1/rag session (`pipeline.run.rag_client.ask`), or a client that
  leaves on purpose at its first `context` event (mid-retrieval) or first `token` (mid-answer);
- `collect_memory`: RSS of this Ray cluster's processes and Serve's running replica count over time;
- `kill_busiest_replica`: the replica-kill drill; `kill_an_ingress`: the ingress-kill drill;
  `drain`: the leak check after the load.

A client whose stream is cut after the answer began reconnects with Last-Event-ID (the rest of the
answer, nothing run again: `resumed`); one cut before any answer event, refused by Serve's proxy
with no ingress answering (5xx), or whose resume is answered `SessionGone` (the answer's replica
died too) asks again once, as a user would (`reasked`: retrieval and generation run again). Either
is counted; neither hides a loss: a session is lost only when no attempt brought a final event. A client planned to leave that is
refused with 429 asks again (up to `LEAVER_ASKS` times): the drill is its disconnect.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter

import httpx

from bench.http_replay import relative_timings
from bench.stats import percentile
from bench.serving_metrics import record_from_summary, serving_metrics
from pipeline.app import ENGINE_DEPLOYMENT, INGRESS_DEPLOYMENT
from pipeline.config import AppConfig
from pipeline.errors import SessionGone
from pipeline.ingress.http_util import INGRESS_HEADER
from pipeline.run.rag_client import RagResult, apply_event, ask, error_reason, sse_events
from stream2llm.data.traces import PromptMode

MEMORY_INTERVAL_S = 1.0
APP = AppConfig.model_fields["name"].default  # the bench runs the app under its default name
RESUME_ATTEMPTS = 3
LEAVER_ASKS, LEAVER_RETRY_S = 3, 2.0  # a planned leaver refused with 429 asks up to 3 times, 2 s apart


# ---- one session ------------------------------------------------------------------------------
async def ask_and_leave(http: httpx.AsyncClient, base: str, question: str, source: dict, leave_on: str,
                        max_tokens: int) -> tuple[RagResult, bool]:
    """Like `ask`, but the client closes the connection at the first `leave_on` event.
    Returns the result and whether it left (False: the answer or an error came first)."""
    body = {"question": question, "source": source, "sampling": {"max_tokens": max_tokens, "temperature": 0.0}}
    result = RagResult(question, PromptMode.STREAM, sent_at=time.monotonic())
    try:
        async with http.stream("POST", f"{base}/v1/rag", json=body) as response:
            result.status = response.status_code
            result.ingresses.append(response.headers.get(INGRESS_HEADER, ""))
            if response.status_code != 200:
                await response.aread()
                result.error = error_reason(response)
                return result, False
            async for name, data, event_id in sse_events(response):
                apply_event(result, name, data, event_id)
                if name == leave_on:
                    return result, True  # leaving the block closes the connection
    except httpx.HTTPError as e:
        result.error = f"{type(e).__name__}: {e}"
    finally:
        result.done_at = time.monotonic()
    return result, False


def outcome(result: RagResult, left: bool, timed_out: bool = False) -> str:
    """answered | rejected (429) | disconnected (left on purpose) | lost (no final event and no
    error reported: a cut stream, a transport error or the client's timeout) | failed (an error
    response or error event). The five are disjoint."""
    if left:
        return "disconnected"
    if result.ok:
        return "answered"
    if timed_out or is_lost(result):
        return "lost"
    return "rejected" if result.status == 429 else "failed"


def is_lost(result: RagResult) -> bool:
    """No final event and no error response: the stream was cut, or nothing came in time."""
    if result.final or result.status not in (0, 200):
        return False
    transport = getattr(httpx, _error_kind(result), None)
    cut = (result.error or "").startswith("the stream ended without")
    return cut or (isinstance(transport, type) and issubclass(transport, httpx.HTTPError))


def _error_kind(result: RagResult) -> str:
    """The error's type name: `RagResult.error` reads "<kind>: <reason>"."""
    return (result.error or "").split(":", 1)[0]


def must_ask_again(result: RagResult) -> bool:
    """What a user does next: ask again when no attempt can continue the answer. The request was cut
    before any answer event (a lost stream), or refused by Serve's proxy (a 5xx with no ingress id:
    no ingress answered it, e.g. the one it went to died), or its answer was lost: a resume was
    answered `SessionGone` (a 404, or an error event when the replica died during the resume)
    because the replica holding the answer died as well as the ingress that drove the session,
    the only process that held its context."""
    if result.final:
        return False
    if result.last_event_id is not None:
        return result.resumed > 0 and _error_kind(result) == SessionGone.__name__
    refused_by_proxy = result.status >= 500 and not (result.ingresses and result.ingresses[-1])
    return is_lost(result) or refused_by_proxy


async def _attempt(http: httpx.AsyncClient, base: str, plan) -> tuple[RagResult, bool]:
    if plan.leave_on is not None:
        return await ask_and_leave(http, base, plan.question, plan.source, plan.leave_on, plan.max_tokens)
    return await ask(http, base, plan.question, plan.source, max_tokens=plan.max_tokens,
                     resume_attempts=RESUME_ATTEMPTS), False


async def _one(http: httpx.AsyncClient, base: str, plan) -> tuple[RagResult, bool, RagResult | None]:
    """The result, whether the client left on purpose, and the first attempt when it asked again."""
    result, left = await _attempt(http, base, plan)
    first_sent, asks = result.sent_at, 1
    while plan.leave_on is not None and result.status == 429 and asks < LEAVER_ASKS:
        # a leaver exists to drive the disconnect path: refused under load, it asks again later
        await asyncio.sleep(LEAVER_RETRY_S)
        result, left = await _attempt(http, base, plan)
        result.sent_at, asks = first_sent, asks + 1
    if left or not must_ask_again(result):
        return result, left, None
    again, left = await _attempt(http, base, plan)
    again.sent_at = result.sent_at  # the user's wait counts from the first attempt
    return again, left, result


async def send_session(http: httpx.AsyncClient, base: str, plan, t0: float, timeout_s: float) -> dict:
    """One planned session at its arrival time; given up (and counted lost) after `timeout_s`."""
    await asyncio.sleep(max(0.0, t0 + plan.at_s - time.monotonic()))
    sent = time.monotonic()
    try:
        result, left, first = await asyncio.wait_for(_one(http, base, plan), timeout_s)
        timed_out = False
    except asyncio.TimeoutError:
        result = RagResult(plan.question, PromptMode.STREAM, sent_at=sent, done_at=time.monotonic())
        left, timed_out, first = False, True, None
        result.error = f"no final event within {timeout_s:.0f} s"
    return {"index": plan.index, "kind": plan.kind, "leave_on": plan.leave_on, "at_s": round(plan.at_s, 3),
            "sent_s": round(result.sent_at - t0, 3), "latency_s": result.latency_s, "ttft_s": result.ttft_s,
            "status": result.status, "outcome": outcome(result, left, timed_out), "ok": result.ok and not left,
            **relative_timings(result),
            "error": result.error, "retrieval_done": result.retrieval_done_at is not None,
            "answered_tokens": bool(result.first_token_at), "recovered": bool(result.final.get("recovered")),
            "replica_id": result.final.get("replica_id"), "contexts": result.contexts, "skipped": result.skipped,
            "resumed": result.resumed, "reasked": first is not None,
            "cut_error": None if first is None else first.error,
            "ingresses": (first.ingresses if first else []) + result.ingresses,
            "session_id": result.session_id or (first.session_id if first else None)}


# ---- cluster-side sampling and drills --------------------------------------------------------------
def cluster_rss_mb() -> dict:
    """RSS of the driver's descendants (this Ray cluster only: raylet, GCS, workers)."""
    import psutil

    total = workers = 0
    count = 0
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            rss = proc.memory_info().rss
            total += rss
            if " ".join(proc.cmdline()[:1]).startswith("ray::"):
                workers += rss
                count += 1
    return {"ray_rss_mb": round(total / 2**20, 1), "worker_rss_mb": round(workers / 2**20, 1), "workers": count}


def running_replicas() -> int | None:
    from ray import serve

    with contextlib.suppress(Exception):
        app = serve.status().applications.get(APP)
        return int(app.deployments[ENGINE_DEPLOYMENT].replica_states.get("RUNNING", 0)) if app else 0
    return None


def _memory_sample() -> dict:
    return {**cluster_rss_mb(), "running_replicas": running_replicas()}


async def collect_memory(stop: asyncio.Event, t0: float, interval_s: float = MEMORY_INTERVAL_S) -> list[dict]:
    samples = []
    while not stop.is_set():
        sample = await asyncio.to_thread(_memory_sample)
        samples.append({"t_s": round(time.monotonic() - t0, 2), **sample})
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)
    return samples


def _kill(replica_id: str, deployment: str = ENGINE_DEPLOYMENT) -> None:
    import ray

    actor = ray.get_actor(f"SERVE_REPLICA::{APP}#{deployment}#{replica_id}", namespace="serve")
    ray.kill(actor, no_restart=True)


def routable_replicas(deployment: str = ENGINE_DEPLOYMENT) -> set[str] | None:
    """Replicas Serve's controller counts as RUNNING: the list it pushes to the routers.

    Private API (the controller's `get_serve_instance_details`, what `serve status` and the
    dashboard read): the public `serve.status()` has only counts, which cannot tell a dead
    replica from one that finished starting at the same moment.
    """
    import ray
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    with contextlib.suppress(Exception):
        controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
        details = ray.get(controller.get_serve_instance_details.remote(), timeout=5)
        replicas = details["applications"][APP]["deployments"][deployment]["replicas"]
        return {r["replica_id"] for r in replicas if str(r["state"]).endswith("RUNNING")}
    return None


async def _dropped_by_controller_s(replica_id: str, killed_at: float, deployment: str = ENGINE_DEPLOYMENT,
                                   timeout_s: float = 60.0) -> float | None:
    """Seconds from the kill until the controller no longer lists the replica as running (routers
    follow that list), polled every 50 ms. None: still listed after `timeout_s`."""
    while time.monotonic() - killed_at < timeout_s:
        routable = await asyncio.to_thread(routable_replicas, deployment)
        if routable is not None and replica_id not in routable:
            return round(time.monotonic() - killed_at, 3)
        await asyncio.sleep(0.05)
    return None


async def _left_routers_s(http: httpx.AsyncClient, base: str, replica_id: str, killed_wall: float,
                          timeout_s: float = 30.0) -> dict[str, float | str | None]:
    """Per ingress replica: seconds from the kill until its router stopped routing to the replica
    (`pipeline.control.routing_exits`, shown in /v1/cluster); "never listed" for a router that did not list
    it (an ingress started after the kill); "ingress gone" for one that last answered listing it
    and then left the running ingresses (killed: its router went with it, when it let go is
    unknown); None for one still listing it after `timeout_s`. Polls /v1/cluster (the proxy spreads
    the polls over the ingress replicas) until every running ingress has answered with a float or
    "never listed", or the timeout."""
    left: dict[str, float | str | None] = {}
    deadline = time.monotonic() + timeout_s
    ingresses = ()
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
            routing = (await http.get(f"{base}/v1/cluster")).json()["routing"]
            exit_at = routing["exits"].get(replica_id)
            left[routing["ingress"]] = (round(exit_at - killed_wall, 3) if exit_at is not None else
                                        None if replica_id in routing["listed"] else "never listed")
        ingresses = await asyncio.to_thread(routable_replicas, INGRESS_DEPLOYMENT) or ()
        if ingresses and all(left.get(i) is not None for i in ingresses):
            break
        await asyncio.sleep(0.1)
    return {i: "ingress gone" if s is None and ingresses and i not in ingresses else s for i, s in left.items()}


async def kill_busiest_replica(http: httpx.AsyncClient, base: str, t0: float, deadline_s: float,
                               record: dict) -> dict:
    """Once two replicas report (or from `deadline_s` on, with one), kill the one holding the most
    sessions, then time how long until Serve's controller drops it. Runs until it has killed; the caller
    cancels it when the load ends first, and awaits it when `record` says the kill happened."""
    while True:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            replicas = (await http.get(f"{base}/v1/cluster")).json()["replicas"]
            elapsed = time.monotonic() - t0
            busiest = max(replicas.items(), key=lambda kv: len(kv[1]["sessions"]), default=None)
            if busiest and busiest[1]["sessions"] and (len(replicas) >= 2 or elapsed >= deadline_s):
                listed = busiest[0] in (await asyncio.to_thread(routable_replicas) or ())
                await asyncio.to_thread(_kill, busiest[0])
                killed_at, killed_wall = time.monotonic(), time.time()
                record.update(killed=True, replica_id=busiest[0], at_s=round(elapsed, 2),
                              replicas_reporting=len(replicas), sessions_on_victim=len(busiest[1]["sessions"]))
                # a victim not yet listed (still starting for Serve) was never routable: nothing to time
                if listed:
                    record["dropped_by_controller_s"], record["left_routers_s"] = await asyncio.gather(
                        _dropped_by_controller_s(busiest[0], killed_at),
                        _left_routers_s(http, base, busiest[0], killed_wall))
                else:
                    record["dropped_by_controller_s"] = None
                record["was_routable"] = listed
                return record
        await asyncio.sleep(0.25)


async def kill_an_ingress(t0: float, at_s: float, record: dict) -> dict:
    """At `at_s` into the load, kill one of the running ingress replicas (the proxy spreads streams
    over them, so some are mid-retrieval and some mid-answer on it); time until the controller drops
    it. Serve starts a replacement; the clients cut by the kill resume or ask again."""
    await asyncio.sleep(max(0.0, t0 + at_s - time.monotonic()))
    running = sorted(await asyncio.to_thread(routable_replicas, INGRESS_DEPLOYMENT) or ())
    if len(running) < 2:  # killing the only ingress would cut the whole HTTP side: not this drill
        return {"killed": False, "reason": f"{len(running)} ingress replica(s) running at {at_s} s"}
    victim = running[0]
    await asyncio.to_thread(_kill, victim, INGRESS_DEPLOYMENT)
    killed_at = time.monotonic()
    record.update(killed=True, replica_id=victim, at_s=round(killed_at - t0, 2), ingress_replicas=len(running))
    record["dropped_by_controller_s"] = await _dropped_by_controller_s(victim, killed_at, INGRESS_DEPLOYMENT)
    return record


async def drain(http: httpx.AsyncClient, base: str, idle_kv_blocks: int, timeout_s: float) -> dict:
    """After the load: until no replica, the central scheduler nor the ingress holds a session and
    KV use is back to its idle level; how long that took (or the state at the timeout)."""
    start = time.monotonic()
    state: dict = {}
    while time.monotonic() - start < timeout_s:
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
            view = (await http.get(f"{base}/v1/cluster")).json()
            health = (await http.get(f"{base}/healthz")).json()
            state = {"replica_sessions": sum(len(r["sessions"]) for r in view["replicas"].values()),
                     "scheduler_sessions": view["pressure"]["sessions"], "queued": view["pressure"]["queued"],
                     "ingress_sessions": health["sessions"], "kv_blocks_used": view["pressure"]["kv_blocks_used"],
                     "idle_kv_blocks": idle_kv_blocks,
                     "open_session_ids": sorted(s for r in view["replicas"].values() for s in r["sessions"])}
            if not (state["replica_sessions"] or state["scheduler_sessions"] or state["ingress_sessions"]
                    or state["queued"]) and state["kv_blocks_used"] <= idle_kv_blocks:
                return {**state, "drained": True, "drained_in_s": round(time.monotonic() - start, 2)}
        await asyncio.sleep(0.25)
    return {**state, "drained": False, "drained_in_s": None}


# ---- summary ----------------------------------------------------------------------------------------
def _stats(values) -> dict:
    values = [v for v in values if v is not None]
    return {"p50": percentile(values, 50), "p95": percentile(values, 95), "max": max(values, default=None)}


def _changes(samples: list[dict], key: str) -> list[tuple[float, int]]:
    """(t_s, value) whenever `key` changes: a compact timeline."""
    out: list[tuple[float, int]] = []
    for s in samples:
        if s.get(key) is not None and (not out or out[-1][1] != s[key]):
            out.append((s["t_s"], s[key]))
    return out


def _ingress_kill_outcome(kill: dict, records: list[dict]) -> dict:
    """The drill's record with what became of the sessions whose stream the killed ingress carried."""
    if not kill.get("killed"):
        return kill
    cut = [r for r in records if r["resumed"] or r["reasked"]]
    on_victim = [r for r in cut if kill["replica_id"] in r["ingresses"]]
    refused = [r for r in cut if r["reasked"] and r["ingresses"][:1] == [""]]  # no ingress id: the proxy's 5xx
    return {**kill, "sessions_cut": len(cut), "cut_on_the_killed_ingress": len(on_victim),
            "refused_by_proxy": len(refused), "cut_outcomes": dict(Counter(r["outcome"] for r in cut))}


def summarize(raw: dict, plans) -> dict:
    records, memory, series = raw["records"], raw["memory"], raw["series"]
    by = Counter(r["outcome"] for r in records)
    counts = {"offered": len(records),
              **{k: by.get(k, 0) for k in ("answered", "rejected", "failed", "lost", "disconnected")},
              "disconnected_mid_retrieval": sum(r["outcome"] == "disconnected" and r["leave_on"] == "context"
                                                for r in records),
              "disconnected_mid_answer": sum(r["outcome"] == "disconnected" and r["leave_on"] == "token"
                                             for r in records),
              "by_source": {k: dict(Counter(r["outcome"] for r in records if r["kind"] == k))
                            for k in sorted({p.kind for p in plans})}}
    mem = [m["ray_rss_mb"] for m in memory]
    workers = [m["worker_rss_mb"] for m in memory]
    answered = [r for r in records if r["outcome"] == "answered"]
    return {
        "counts": counts,
        "recovered": sum(r["recovered"] for r in answered),
        "resumed": sum(r["resumed"] > 0 for r in records),  # cut mid-answer, reconnected (outcomes: ingress_kill)
        "reasked": sum(r["reasked"] for r in records),       # no attempt could go on (must_ask_again): asked again
        "kill": raw["kill"],
        "ingress_kill": _ingress_kill_outcome(raw.get("ingress_kill", {"killed": False}), records),
        "leaks": raw["drain"],
        "memory_mb": {"ray_start": mem[0] if mem else None, "ray_peak": max(mem, default=None),
                      "ray_final": mem[-1] if mem else None, "workers_start": workers[0] if workers else None,
                      "workers_peak": max(workers, default=None), "workers_final": workers[-1] if workers else None},
        "replicas": {"running_max": max((m["running_replicas"] or 0 for m in memory), default=None),
                     "running_final": memory[-1]["running_replicas"] if memory else None,
                     "running_timeline": _changes(memory, "running_replicas"),
                     "reporting_timeline": _changes(series, "replicas")},
        "kv": {"blocks_total_max": max((s["kv_blocks_total"] for s in series), default=None),
               "blocks_used_peak": max((s["kv_blocks_used"] for s in series), default=None),
               "sessions_peak": max((s["sessions"] for s in series), default=None),
               "queued_peak": max((s["queued"] for s in series), default=None), "idle": raw["idle"]},
        "latency_s": _stats(r["latency_s"] for r in answered), "ttft_s": _stats(r["ttft_s"] for r in answered),
        # sessions left on purpose are neither completed nor failed: not in the serving metrics
        "serving": serving_metrics([record_from_summary(r) for r in records if r["outcome"] != "disconnected"],
                                   max(raw["load_s"], 1e-9), slos_ms=raw.get("slos_ms")),
        "load_s": raw["load_s"],
        "failures": [r for r in records if r["outcome"] in ("failed", "lost")],
        "records": records, "cluster_series": series, "memory_series": memory,
    }
