"""The FastAPI application: OpenAI-compatible completions and chat, models, health and metrics."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel

from specdecode.core.sampling import SamplingParams
from specdecode.pipeline import Pipeline
from specdecode.server.engine import Engine, GenerationRequest, finish_reason
from specdecode.server.errors import APIError, install_error_handlers
from specdecode.server.metrics import PROMETHEUS_CONTENT_TYPE, Metrics, RequestMetricsMiddleware
from specdecode.server.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatDelta,
    CompletionChoice,
    CompletionChunk,
    CompletionRequest,
    CompletionResponse,
    ErrorBody,
    Health,
    ModelCard,
    ModelList,
    SpeculativeUsage,
    Usage,
    GenerationFields,
    request_field_names,
)
from specdecode.server.worker import Cancelled, Delta, Failed, Finished, Job, Worker

__all__ = ["ServerConfig", "create_app"]

_ERRORS = {status: {"model": ErrorBody} for status in (400, 404, 429, 500, 503)}


@dataclass(frozen=True)
class ServerConfig:
    """Limits and names of a server (every limit has a default)."""

    model_id: str | None = None  # the served model's name; default: the target's source
    max_prompt_tokens: int = 2048  # longer prompts: 400 context_length_exceeded (also capped by the context window)
    max_tokens: int = 400  # largest max_tokens a request may ask for
    default_max_tokens: int = 16  # /v1/completions without max_tokens (as OpenAI; at most max_tokens); chat: max_tokens
    max_queue: int = 64  # requests that may wait while max_batch run; beyond: 429
    max_batch: int = 1  # requests decoded together (> 1: batched forward passes on the native engine)
    shutdown_grace: float = 30.0  # seconds the running generation may go on at shutdown
    draft_aliases: tuple[str, ...] = ()  # extra names for the configured draft (e.g. the path it was loaded from)

    def __post_init__(self) -> None:
        for name in ("max_prompt_tokens", "max_tokens", "default_max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {self.max_queue}")
        if isinstance(self.max_batch, bool) or not isinstance(self.max_batch, int) or self.max_batch < 1:
            raise ValueError(f"max_batch must be an integer >= 1, got {self.max_batch!r}")
        if not self.shutdown_grace >= 0:  # also NaN
            raise ValueError(f"shutdown_grace must be a number >= 0, got {self.shutdown_grace}")

    @property
    def completion_max_tokens(self) -> int:
        """max_tokens of a /v1/completions request that leaves it out: default_max_tokens, within max_tokens."""
        return min(self.default_max_tokens, self.max_tokens)


def create_app(pipeline: Pipeline, config: ServerConfig = ServerConfig()) -> FastAPI:
    """An app serving `pipeline`; its worker threads start and stop with the app's lifespan."""
    worker: Worker  # set below; the gauges read it lazily
    metrics = Metrics(waiting=lambda: worker.waiting, running=lambda: worker.running)
    engine = Engine(pipeline, model_id=config.model_id, draft_aliases=config.draft_aliases,
                    max_batch=config.max_batch, on_pass=metrics.observe_pass)
    worker = Worker(engine.run, max_queue=config.max_queue, on_done=metrics.observe_job,
                    concurrency=config.max_batch, on_submit=metrics.observe_queue)
    created = int(time.time())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await worker.start()
        try:
            yield
        finally:
            await worker.close(grace=config.shutdown_grace)

    app = FastAPI(title="specdecode", summary="OpenAI-compatible server with exact speculative decoding", lifespan=lifespan)
    app.state.config, app.state.engine, app.state.worker, app.state.metrics = config, engine, worker, metrics
    install_error_handlers(app, request_field_names())

    @app.post("/v1/completions", response_model=CompletionResponse, responses=_ERRORS)
    async def completions(body: CompletionRequest, request: Request):
        prompt_ids = engine.encode_prompt(body.prompt)
        generation = _generation_request(body, prompt_ids, body.max_tokens or config.completion_max_tokens, "prompt", engine, config)
        job = worker.submit(generation)
        meta = _Meta("cmpl-" + uuid.uuid4().hex, int(time.time()), engine.model_id)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return _EventStream(_completion_events(job, meta, include_usage), job)
        done = await _wait_or_disconnect(job, request)
        return CompletionResponse(
            id=meta.id, created=meta.created, model=meta.model,
            choices=[CompletionChoice(text=done.text, finish_reason=finish_reason(done.result.finish_reason))],
            usage=_usage(generation, done),
        )

    @app.post("/v1/chat/completions", response_model=ChatCompletionResponse, responses=_ERRORS)
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        if body.max_tokens is not None and body.max_completion_tokens is not None:
            raise APIError(400, "max_completion_tokens: give max_tokens or max_completion_tokens, not both",
                           param="max_completion_tokens", code="invalid_value")
        messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in body.messages]
        prompt_ids = engine.encode_chat(messages)
        max_tokens = body.max_completion_tokens or body.max_tokens
        param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
        generation = _generation_request(body, prompt_ids, max_tokens or config.max_tokens, "messages", engine, config, param)
        job = worker.submit(generation)
        meta = _Meta("chatcmpl-" + uuid.uuid4().hex, int(time.time()), engine.model_id)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return _EventStream(_chat_events(job, meta, include_usage), job)
        done = await _wait_or_disconnect(job, request)
        return ChatCompletionResponse(
            id=meta.id, created=meta.created, model=meta.model,
            choices=[ChatChoice(message=AssistantMessage(content=done.text),
                                finish_reason=finish_reason(done.result.finish_reason))],
            usage=_usage(generation, done),
        )

    @app.get("/v1/models", response_model=ModelList)
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=engine.model_id, created=created)])

    @app.get("/health", response_model=Health, responses={503: {"model": Health}})
    async def health():
        status = "ok" if worker.accepting else "unavailable"
        body = Health(status=status, model=engine.model_id, draft=engine.default_draft, gamma=pipeline.gamma,
                      min_confidence=engine.min_confidence(engine.default_draft),
                      waiting=worker.waiting, running=worker.running, max_batch=engine.max_batch,
                      pass_seconds=None if engine.pass_costs is None else engine.pass_costs.to_dict()["seconds"])
        return JSONResponse(body.model_dump(), status_code=200 if worker.accepting else 503)

    @app.get("/metrics", response_class=Response)
    async def prometheus_metrics() -> Response:
        return Response(metrics.exposition(), media_type=PROMETHEUS_CONTENT_TYPE)

    @app.get("/metrics.json")
    @app.get("/v1/metrics")
    async def json_metrics() -> dict:
        return metrics.snapshot()

    endpoints = {route.path for route in app.routes if hasattr(route, "methods")}
    app.add_middleware(RequestMetricsMiddleware, metrics=metrics, endpoints=endpoints)
    return app


# --------------------------------------------------------------------------- helpers


@dataclass(frozen=True)
class _Meta:
    id: str
    created: int
    model: str


def _generation_request(
    body: GenerationFields,
    prompt_ids: list[int],
    max_tokens: int,
    prompt_param: str,
    engine: Engine,
    config: ServerConfig,
    max_tokens_param: str = "max_tokens",
) -> GenerationRequest:
    """Check a request against the server's limits and turn it into a GenerationRequest."""
    if body.model is not None and body.model != engine.model_id:
        raise APIError(404, f"model: the model {body.model!r} does not exist; this server serves {engine.model_id!r}",
                       param="model", code="model_not_found")
    if max_tokens > config.max_tokens:
        raise APIError(400, f"{max_tokens_param}: at most {config.max_tokens} tokens per request, got {max_tokens}",
                       param=max_tokens_param, code="invalid_value")
    limit = min(config.max_prompt_tokens, engine.context_length - 1)
    if len(prompt_ids) > limit:
        raise APIError(400, f"{prompt_param}: the prompt has {len(prompt_ids)} tokens, more than the limit of {limit}",
                       param=prompt_param, code="context_length_exceeded")
    draft = engine.resolve_draft(body.draft)
    if body.min_confidence is not None and engine.min_confidence(draft) is None:
        raise APIError(400, f"min_confidence: draft {draft!r} has no early end; it applies to draft models only",
                       param="min_confidence", code="unsupported_value")
    sampling = SamplingParams(
        temperature=1.0 if body.temperature is None else body.temperature,
        top_k=body.top_k or None,
        top_p=1.0 if body.top_p is None else body.top_p,
    )
    seed = body.seed if body.seed is not None else secrets.randbits(63)  # no seed: a fresh random one
    if not -(2**63) <= seed < 2**64:
        raise APIError(400, "seed: must fit in 64 bits", param="seed", code="invalid_value")
    return GenerationRequest(
        prompt_ids=tuple(prompt_ids),
        max_tokens=max_tokens,
        sampling=sampling,
        stop=tuple(body.stop_list()),
        seed=seed,
        draft=draft,
        gamma=body.gamma,
        min_confidence=body.min_confidence if body.min_confidence is not None else engine.min_confidence(draft),
        seeded=body.seed is not None,
    )


def _usage(request: GenerationRequest, done: Finished) -> Usage:
    stats = done.result.stats
    completion = len(done.result.token_ids)
    return Usage(
        prompt_tokens=len(request.prompt_ids),
        completion_tokens=completion,
        total_tokens=len(request.prompt_ids) + completion,
        speculative=SpeculativeUsage(
            draft=request.draft, gamma=stats.gamma, min_confidence=request.min_confidence,
            target_calls=stats.target_calls, draft_tokens=stats.draft_tokens,
            accepted_tokens=stats.accepted_tokens, mean_accepted=stats.mean_accepted, alpha=stats.alpha,
            seconds=stats.seconds, tokens_per_s=stats.tokens_per_s,
        ),
    )


async def _wait_or_disconnect(job: Job, request: Request) -> Finished:
    """The job's result; if the client disconnects first, cancel the job (status 499, sent to no one)."""
    waiter = asyncio.ensure_future(job.wait())
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({waiter, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not waiter.done():
            job.cancel()
            waiter.cancel()
    if not waiter.done() or waiter.cancelled():
        raise APIError(499, "client closed the request", code="client_closed_request")
    outcome = waiter.result()
    if isinstance(outcome, Failed):
        raise outcome.error
    if isinstance(outcome, Cancelled):
        raise APIError(499, "the generation was cancelled", code="cancelled")
    return outcome


async def _disconnected(request: Request) -> None:
    """Returns once the client has gone (the body has been read, so only http.disconnect can arrive)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class _EventStream(StreamingResponse):
    """Server-sent events of a job, which is cancelled however the response ends: the client leaving mid-stream,
    or before the first chunk, when the events' generator never starts (so no `finally` of its own would run)."""

    def __init__(self, events: AsyncIterator[str], job: Job) -> None:
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.job = job

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.cancel()  # a no-op once the job has ended


def _data(payload: BaseModel | dict | str) -> str:
    if isinstance(payload, BaseModel):
        payload = payload.model_dump_json()
    elif isinstance(payload, dict):
        payload = json.dumps(payload)
    return f"data: {payload}\n\n"


async def _completion_events(job: Job, meta: _Meta, include_usage: bool) -> AsyncIterator[str]:
    def chunk(choices: list[CompletionChoice], usage: Usage | None = None) -> str:
        return _data(CompletionChunk(id=meta.id, created=meta.created, model=meta.model, choices=choices, usage=usage))

    async for event in job.events():  # the response cancels the job when the client goes (`_EventStream`)
        if isinstance(event, Delta) and event.text:
            yield chunk([CompletionChoice(text=event.text)])
        elif isinstance(event, Finished):
            yield chunk([CompletionChoice(text="", finish_reason=finish_reason(event.result.finish_reason))])
            if include_usage:
                yield chunk([], _usage(job.request, event))  # type: ignore[arg-type]
            yield "data: [DONE]\n\n"
        elif isinstance(event, Failed):
            yield _data(event.error.body())


async def _chat_events(job: Job, meta: _Meta, include_usage: bool) -> AsyncIterator[str]:
    def chunk(choices: list[ChatChunkChoice], usage: Usage | None = None) -> str:
        return _data(ChatCompletionChunk(id=meta.id, created=meta.created, model=meta.model, choices=choices, usage=usage))

    yield chunk([ChatChunkChoice(delta=ChatDelta(role="assistant", content=""))])
    async for event in job.events():  # the response cancels the job when the client goes (`_EventStream`)
        if isinstance(event, Delta) and event.text:
            yield chunk([ChatChunkChoice(delta=ChatDelta(content=event.text))])
        elif isinstance(event, Finished):
            yield chunk([ChatChunkChoice(delta=ChatDelta(), finish_reason=finish_reason(event.result.finish_reason))])
            if include_usage:
                yield chunk([], _usage(job.request, event))  # type: ignore[arg-type]
            yield "data: [DONE]\n\n"
        elif isinstance(event, Failed):
            yield _data(event.error.body())
