"""FastAPI ingress deployment: /v1/rag, the streaming-input API, OpenAI routes, health, metrics.

Routes are thin: they validate (pydantic), then run a flow from `pipeline.ingress.flows` or
`pipeline.ingress.openai_routes`. Errors become `{"error", "reason"}` with a 4xx status (429 with
Retry-After when admission is refused) on every path, FastAPI's validation and Starlette's 404/405
included; the OpenAI-compatible routes answer with OpenAI's error object instead. Errors after an
SSE stream started become an `error` event. SSE answers carry ids: a request repeated with
`Last-Event-ID` (or `GET /v1/streams/{id}/answer`) gets the rest of the answer from its replica.
"""

from __future__ import annotations

import asyncio
import logging

from ray import serve

from fastapi import FastAPI, Header
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine.prompt import piece_text
from pipeline.ingress import openai_routes
from pipeline.control.central import SchedulerUnavailable, get_or_create_scheduler, scheduler_health
from pipeline.ingress.replica_client import EngineClient
from pipeline.config import AppConfig
from pipeline.errors import AdmissionRejected, BadRequest, ReplicaNotReady, unwrap
from pipeline.ingress.cleanup import cleanup
from pipeline.ingress.flows import (FlowContext, answer_events, parse_context_event_id, parse_event_id, rag_events,
                                    resume_events)
from pipeline.ingress.takeover import takeover_events
from pipeline.ingress.http_util import (LimitsMiddleware, error_response, event_stream, first_then_rest,
                                http_exception_response, validation_response)
from pipeline.ingress.metrics import PipelineMetrics
from pipeline.ingress.oneshot import oneshot_rag_events
from pipeline.ingress.prompt import fetch_template
from pipeline.ingress.retriever_actors import RetrieverActors
from pipeline.control.routing_exits import LISTED, ROUTING_EXITS
from pipeline.schemas import (BODY_ERRORS, HEALTH_RESPONSES, ChatCompletionRequest, ChunkBody, CompletionRequest,
                              FinishBody, OpenStream, RagRequest, ReplaceBody, error_responses, event_stream_or_json,
                              text_response)
from pipeline.sessions.store import SessionStore
from pipeline.sources import source_type
from stream2llm.data.traces import ContextOp, PromptMode

log = logging.getLogger("stream2llm.ingress")

NOT_READY_RETRY_S = 5  # Retry-After while no engine replica has started (a start takes 15-30 s here)

api = FastAPI(title="stream2llm", description="Streaming RAG on Ray Serve")
api.add_exception_handler(RequestValidationError, validation_response)
api.add_exception_handler(StarletteHTTPException, http_exception_response)
api.add_middleware(LimitsMiddleware)


class Ingress:
    def __init__(self, engine_handle, config: dict):
        self.config = AppConfig.model_validate(config)
        self.scheduler = get_or_create_scheduler(self.config)
        self.handle = engine_handle
        # Session records live in shard actors (any ingress replica serves any session); idle
        # sessions are dropped there and aborted by their replicas after the TTL.
        replica = serve.get_replica_context().replica_id
        self.ingress_id = replica.unique_id
        self.actor_name = replica.to_full_id_str()  # what replicas and shards look up: is this ingress alive
        self.sessions = SessionStore(self.config, owner=self.actor_name)
        self.client = EngineClient(engine_handle, self.scheduler, self.config.limits.admission_timeout_s,
                                   self.config.context_limit, self.config.scheduler.admission_slots,
                                   max_model_len=self.config.model.max_model_len, sessions=self.sessions)
        self.metrics = PipelineMetrics()
        self.actors = RetrieverActors(self.config)
        if self.config.retrievers.warm_pools:  # kept: the event loop holds its tasks weakly
            self._warming = asyncio.get_running_loop().create_task(self.actors.warm())
        LimitsMiddleware.configure(self.config.limits.max_request_bytes, self.config.auth.bearer_tokens,
                                   self.ingress_id)
        self._flow_context: FlowContext | None = None
        self._ready = False  # an engine replica has reported (see _replica_ready)

    async def _flow(self) -> FlowContext:
        """The collaborators of the flows; the model's RAG prompt text comes from a replica, once."""
        if self._flow_context is None:
            template = await fetch_template(self.handle)
            self._flow_context = FlowContext(self.client, self.sessions, self.metrics, self.actors, template,
                                             self.config.context_limit, owner=self.actor_name)
        return self._flow_context

    async def _replica_ready(self) -> bool:
        """Whether an engine replica has reported to the central scheduler (it reports once its
        engine is built). Once true it stays true in this process: liveness is /healthz's."""
        if not self._ready:
            try:
                self._ready = (await scheduler_health(self.scheduler, timeout_s=2.0))["replicas"] > 0
            except SchedulerUnavailable:
                return False
        return self._ready

    async def _run(self, coro, openai: bool = False):
        try:
            return await coro
        except Exception as e:
            if isinstance(unwrap(e), AdmissionRejected):
                self.metrics.rejected.inc()
            return error_response(e, openai=openai)

    async def _resume(self, last_event_id: str, session_id: str | None, stream: bool):
        """The rest of an answer after `last_event_id` (an answer event's id), from its replica."""
        parsed = parse_event_id(last_event_id)
        if parsed is None or (session_id is not None and parsed[0] != session_id):
            raise BadRequest(f"Last-Event-ID {last_event_id!r} is not an answer event of this session "
                             "(a streaming-input session's context is kept by its record: finish it)")
        events = await first_then_rest(resume_events(await self._flow(), *parsed))
        return event_stream(events) if stream else await _collect(events)


def _route(method: str, path: str, **kw):
    return getattr(api, method)(path, **kw)


class IngressRoutes(Ingress):
    @_route("get", "/healthz", responses=HEALTH_RESPONSES)
    async def healthz(self):
        try:
            pressure = await scheduler_health(self.scheduler, timeout_s=2.0)
        except SchedulerUnavailable as e:
            return JSONResponse({"ok": False, "reason": str(e)}, status_code=503)
        ok = pressure["replicas"] > 0
        return JSONResponse({"ok": ok, "replicas": pressure["replicas"], "sessions": await self.sessions.count()},
                            status_code=200 if ok else 503)

    @_route("get", "/metrics", response_class=Response, responses=text_response("text/plain", "Prometheus text format."))
    async def metrics_route(self):
        replicas, pressure, moves = await asyncio.gather(self.scheduler.replicas.remote(),
                                                         self.scheduler.pressure.remote(), self.scheduler.moves.remote())
        self.metrics.refresh(replicas, pressure, moves)
        self.metrics.count_admissions(self.client.central.from_slots, self.client.central.through_actor)
        return Response(self.metrics.render(), media_type=self.metrics.content_type)

    @_route("get", "/v1/cluster")
    async def cluster(self):
        """The central scheduler's view (pressure, live replicas, how sessions moved between replicas:
        `pipeline.control.central.MOVE_OUTCOMES`) and this ingress's routing exits."""
        replicas, pressure, moves = await asyncio.gather(self.scheduler.replicas.remote(),
                                                         self.scheduler.pressure.remote(), self.scheduler.moves.remote())
        # this ingress's router: when it stopped routing to replicas that left (the drills read it)
        routing = {"ingress": self.ingress_id, "exits": dict(ROUTING_EXITS), "listed": sorted(LISTED)}
        return {"pressure": pressure, "replicas": replicas, "routing": routing, "moves": moves}

    @_route("post", "/v1/rag", responses={**event_stream_or_json("The answer: SSE events (session, context, token, final), or JSON."),
                                       **error_responses(*BODY_ERRORS, 404, 409, 429, 501, 503)})
    async def rag(self, body: RagRequest, last_event_id: str | None = Header(None)):
        if last_event_id and (context := parse_context_event_id(last_event_id)) is not None:
            return await self._run(self._takeover(body, *context))
        if last_event_id:
            return await self._run(self._resume(last_event_id, None, body.stream))
        return await self._run(self._rag(body))

    async def _takeover(self, body: RagRequest, session_id: str, replica_id: str, position: int):
        """A client whose stream was cut before the answer (its ingress died) reconnected with the id
        of the last event it got: this ingress drives the session from there (`takeover_events`)."""
        if body.prompt_mode == PromptMode.ONESHOT:
            raise BadRequest("a one-shot request has no context events to resume from: ask again")
        self.config.check_answer_length(body.sampling.max_tokens)
        events = await first_then_rest(takeover_events(await self._flow(), body, session_id, replica_id, position))
        return event_stream(events) if body.stream else await _collect(events)

    async def _rag(self, body: RagRequest):
        self.config.check_answer_length(body.sampling.max_tokens)
        flow = await self._flow()
        if body.prompt_mode == PromptMode.ONESHOT:
            events = oneshot_rag_events(flow, body, source_type(body.source))
        else:
            events = rag_events(flow, body)
        events = await first_then_rest(events)
        if body.stream:
            return event_stream(events)
        return await _collect(events)

    @_route("post", "/v1/streams", status_code=201, responses=error_responses(*BODY_ERRORS, 429, 503))
    async def open_stream(self, body: OpenStream):
        return await self._run(self._open(body))

    async def _open(self, body: OpenStream):
        session = await self.client.open(body.source_type)
        try:
            await self.sessions.add(session)
        except BaseException:
            await cleanup(self.client.abort(session))
            raise
        return JSONResponse(session.summary(), status_code=201)

    @_route("get", "/v1/streams/{session_id}", responses=error_responses(404))
    async def stream_info(self, session_id: str):
        return await self._run(self._info(session_id))

    async def _info(self, session_id: str):
        return (await self.sessions.get(session_id, for_change=False))[0].summary()

    @_route("post", "/v1/streams/{session_id}/chunks", responses=error_responses(*BODY_ERRORS, 404, 409, 429, 503))
    async def append_chunk(self, session_id: str, body: ChunkBody):
        return await self._run(self._add(session_id, ContextOp.APPEND, [body], body.seq))

    @_route("put", "/v1/streams/{session_id}/context", responses=error_responses(*BODY_ERRORS, 404, 409, 429, 503))
    async def replace_context(self, session_id: str, body: ReplaceBody):
        return await self._run(self._add(session_id, ContextOp.REPLACE, body.chunks, body.seq))

    async def _add(self, session_id: str, op: ContextOp, chunks: list[ChunkBody], seq: int | None):
        session, duplicate = await self.sessions.get(session_id, claim_seq=seq)
        if duplicate:  # a retry of a change already applied (through any ingress)
            return {**session.summary(), "duplicate": True}
        text = "".join(_piece(c, i + session.chunks) for i, c in enumerate(chunks))
        cites = [{"source_id": c.source_id, "title": c.title} for c in chunks if c.source_id]
        try:
            self.sessions.check_chunk_room(session)
            self.metrics.ingress_chunk_bytes.inc(len(text.encode()))
            tokens = await self.client.add(session, op, text, seq)
        except BaseException:
            if seq is not None:
                await cleanup(self.sessions.unclaim(session, seq))
            raise
        session.last_seq = session.last_seq if seq is None else seq
        session.sources[:] = cites if op == ContextOp.REPLACE else session.sources + cites
        await self.sessions.commit(session, (op, text), cites)
        return {**session.summary(), "context_tokens": tokens, "duplicate": False}

    @_route("post", "/v1/streams/{session_id}/finish", responses={**event_stream_or_json("The answer: SSE or JSON."),
                                                               **error_responses(*BODY_ERRORS, 404, 409, 429, 503)})
    async def finish_stream(self, session_id: str, body: FinishBody, last_event_id: str | None = Header(None)):
        if last_event_id:
            return await self._run(self._resume(last_event_id, session_id, body.stream))
        return await self._run(self._finish(session_id, body))

    @_route("get", "/v1/streams/{session_id}/answer", responses={**text_response("text/event-stream", "The rest of the answer."),
                                                             **error_responses(400, 404, 409)})
    async def answer_stream(self, session_id: str, last_event_id: str | None = Header(None)):
        """EventSource-style reconnect (GET with Last-Event-ID) to an answer in progress or done."""
        if not last_event_id:
            return error_response(BadRequest("give the Last-Event-ID header of the last answer event received"))
        return await self._run(self._resume(last_event_id, session_id, True))

    async def _finish(self, session_id: str, body: FinishBody):
        self.config.check_answer_length(body.sampling.max_tokens)
        session = await self.sessions.finish(session_id)  # exactly one finish wins; the rest get 409
        events = answer_events(await self._flow(), session, body.question, body.sampling.model_dump(), "streams")
        events = await first_then_rest(events)
        return event_stream(events) if body.stream else await _collect(events)

    @_route("delete", "/v1/streams/{session_id}", status_code=204, responses=error_responses(404))
    async def delete_stream(self, session_id: str):
        return await self._run(self._delete(session_id))

    async def _delete(self, session_id: str):
        session, _ = await self.sessions.get(session_id, for_change=False)
        await self.sessions.drop(session_id)
        await self.client.abort(session)
        self.metrics.aborted.labels("deleted").inc()
        return Response(status_code=204)

    @_route("get", "/v1/models", responses=error_responses(503, openai=True))
    async def models(self):
        """503 with Retry-After until an engine replica can serve (clients such as `vllm bench serve`
        start on this route's 200)."""
        if not await self._replica_ready():
            return error_response(ReplicaNotReady("no engine replica is ready yet", NOT_READY_RETRY_S), openai=True)
        return openai_routes.models(self.config)

    @_route("post", "/v1/completions", responses={**event_stream_or_json("A completion, or SSE chunks with stream=true."),
                                               **error_responses(*BODY_ERRORS, 404, 429, 503, openai=True)})
    async def completions(self, body: CompletionRequest):
        return await self._run(openai_routes.completions(self, body), openai=True)

    @_route("post", "/v1/chat/completions", responses={**event_stream_or_json("A chat completion, or SSE chunks with stream=true."),
                                                    **error_responses(*BODY_ERRORS, 404, 429, 503, openai=True)})
    async def chat_completions(self, body: ChatCompletionRequest):
        return await self._run(openai_routes.chat_completions(self, body), openai=True)


def _piece(chunk: ChunkBody, index: int) -> str:
    if chunk.source_id is None and chunk.title is None:
        return chunk.text
    return piece_text(chunk.source_id or f"chunk-{index}", chunk.title or "", chunk.text)


async def _collect(events) -> dict:
    out: dict = {"answer": "", "contexts": [], "source_errors": []}
    async for name, data, *_ in events:
        if name == "token":
            out["answer"] += data["text"]
        elif name == "context":
            out["contexts"].append(data)
        elif name == "source_error":
            out["source_errors"].append(data)
        elif name == "final":
            out["final"] = data
    return out
