"""The OpenAI-compatible HTTP API over an ``Engine``: completions, chat, models, health, metrics.

``create_app(engine, ServerConfig(...))`` gives a FastAPI app; ``opforge serve`` runs it with
uvicorn. The engine's step loop runs in its own thread; this side only tokenizes, submits,
and forwards each request's outputs (``async for`` over the engine's stream) as JSON or as
server-sent events, so HTTP work never holds up a step. A client that goes away has its request
aborted at once (its KV blocks are freed by the engine).
"""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Optional

from fastapi import FastAPI, Request
from pydantic import ValidationError
from starlette.responses import JSONResponse, Response, StreamingResponse

from . import EngineStoppedError, SamplingParams
from .chat_template import ChatTemplate, ChatTemplateError
from .errors import APIError, BodyLimit, install_error_handlers, parse_json, validation_error
from .metrics import ServerMetrics
from .openai_schemas import (AssistantMessage, ChatChoice, ChatCompletion, ChatCompletionRequest, Completion,
                             CompletionChoice, CompletionRequest, ModelCard, ModelList, StreamChunks, Usage)
from .stream import merge_outputs


@dataclass
class ServerConfig:
    """What the HTTP side needs besides the engine.

    Attributes:
        model_name: the name clients pass as ``model`` (others get 404).
        chat_template: the checkpoint's template; without one, chat requests get a 400.
        api_key: when set, ``/v1/*`` requires ``Authorization: Bearer <api_key>`` (else 401).
        max_waiting: requests allowed to wait for admission; beyond it, 429 with ``Retry-After``.
        max_body_bytes: larger request bodies get 413.
        retry_after_s: the ``Retry-After`` a 429 carries.
    """

    model_name: str
    chat_template: Optional[ChatTemplate] = None
    api_key: Optional[str] = None
    max_waiting: Optional[int] = None
    max_body_bytes: int = 4 << 20
    retry_after_s: int = 1


@dataclass
class _Prepared:
    """A validated request ready for the engine."""

    kind: str                 # "completion" or "chat"
    request_id: str
    prompt: list[int]
    params: Any
    stream: bool
    include_usage: bool


class _Progress:
    """One request's outputs as they arrive: text, counts, finish reason, latency metrics."""

    def __init__(self, metrics: ServerMetrics, arrived: float):
        self.metrics, self.arrived, self.last = metrics, arrived, None
        self.text: list[str] = []
        self.finish_reason: Optional[str] = None
        self.prompt_tokens = self.completion_tokens = 0

    def add(self, out: Any) -> None:
        now = time.perf_counter()
        n = len(out.new_token_ids)
        if n:
            if self.last is None:
                ttft = out.time_to_first_token
                self.metrics.ttft.observe(ttft if ttft is not None else now - self.arrived)
            else:
                for _ in range(n):
                    self.metrics.itl.observe((now - self.last) / n)
            self.last = now
        self.text.append(out.new_text)
        self.prompt_tokens, self.completion_tokens = out.prompt_tokens, out.completion_tokens
        if out.finished:
            self.finish_reason = out.finish_reason
            self.metrics.e2e.observe(now - self.arrived)

    def usage(self) -> Usage:
        return Usage(prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens,
                     total_tokens=self.prompt_tokens + self.completion_tokens)


class _EngineStreamResponse(StreamingResponse):
    """A streaming response that runs ``on_close`` however it ends (done, disconnected, cancelled)."""

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None]):
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


_FIELDS = ("prompt", "max_tokens", "temperature", "top_k", "top_p", "min_tokens", "seed", "stop", "stop_token_ids",
           "ignore_eos")


def _field_named(message: str) -> Optional[str]:
    """The request field an engine or sampling error message starts with ("stop must be ...").

    Example:
        >>> _field_named("prompt: token id 99 is outside the vocabulary"), _field_named("params.stop: needs a tokenizer")
        ('prompt', 'stop')
    """
    head = message.split(None, 1)[0].rstrip(":") if message else ""
    head = head.removeprefix("params.")
    return head if head in _FIELDS else None


class OpenAIServer:
    """The request handlers: validation, prompt building, submission, and answers."""

    def __init__(self, engine: Any, config: ServerConfig):
        self.engine, self.config = engine, config
        self.metrics = ServerMetrics(engine)
        self.created = int(time.time())

    # ---- validation -----------------------------------------------------------------------------
    def check_auth(self, request: Request, endpoint: str) -> None:
        key = self.config.api_key
        if key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
            self.metrics.finished(endpoint, "unauthorized")
            raise APIError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'",
                           code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    def _parse(self, body: bytes, model: type) -> Any:
        data = parse_json(body)
        if not isinstance(data, dict):
            raise APIError(400, f"the request body must be a JSON object, got {type(data).__name__}")
        try:
            req = model.model_validate(data)
        except ValidationError as e:
            raise validation_error(e.errors(include_url=False)) from e
        if req.model != self.config.model_name:
            raise APIError(404, f"the model {req.model!r} does not exist; this server serves "
                                f"{self.config.model_name!r}", param="model", code="model_not_found")
        unsupported = req.unsupported()
        if unsupported:
            raise APIError(400, unsupported[1], param=unsupported[0], code="unsupported_parameter")
        return req

    def _encode(self, text: str, param: str, add_special_tokens: bool) -> list[int]:
        tok = self.engine.tokenizer
        if tok is None:
            raise APIError(400, "this model has no tokenizer: send the prompt as token ids", param=param)
        return tok.encode(text, add_special_tokens=add_special_tokens).ids

    def _completion_prompt(self, req: CompletionRequest) -> list[int]:
        prompt = req.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise APIError(400, f"one prompt per request is supported, got {len(prompt)}", param="prompt")
            prompt = prompt[0]
        ids = self._encode(prompt, "prompt", True) if isinstance(prompt, str) and prompt else list(prompt)
        if not ids:
            raise APIError(400, "the prompt is empty", param="prompt")
        return ids

    def _chat_prompt(self, req: ChatCompletionRequest) -> list[int]:
        template = self.config.chat_template
        if template is None:
            raise APIError(400, "this model has no chat template (tokenizer_config.json 'chat_template'): "
                                "use /v1/completions", param="messages")
        messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text(),
                     **({"name": m.name} if m.name else {})} for m in req.messages]
        try:
            text = template.render(messages, add_generation_prompt=req.add_generation_prompt)
        except ChatTemplateError as e:
            raise APIError(400, str(e), param="messages") from e
        ids = self._encode(text, "messages", False)    # the template writes the special tokens itself
        if not ids:
            raise APIError(400, "the messages render to an empty prompt", param="messages")
        return ids

    def _params(self, req: Any, prompt_len: int, max_tokens: Optional[int], prompt_param: str) -> Any:
        limit = self.engine.max_model_len
        if prompt_len >= limit:
            raise APIError(400, f"the prompt has {prompt_len} tokens; this model's context is {limit} tokens",
                           param=prompt_param, code="context_length_exceeded")
        if max_tokens is None:
            max_tokens = limit - prompt_len
        elif prompt_len + max_tokens > limit:
            raise APIError(400, f"max_tokens={max_tokens} plus the prompt's {prompt_len} tokens exceed this "
                                f"model's context of {limit} tokens", param="max_tokens",
                           code="context_length_exceeded")
        stop = [req.stop] if isinstance(req.stop, str) else req.stop
        try:
            return self._sampling_params(req, max_tokens, stop)
        except ValueError as e:          # SamplingParams' own checks, naming the field
            raise APIError(400, str(e), param=_field_named(str(e)), code="invalid_value") from e

    @staticmethod
    def _sampling_params(req: Any, max_tokens: int, stop: Optional[list[str]]) -> Any:
        return SamplingParams(
            max_tokens=max_tokens, temperature=1.0 if req.temperature is None else req.temperature,
            top_k=req.top_k if req.top_k and req.top_k > 0 else None,
            top_p=req.top_p if req.top_p is not None and req.top_p < 1.0 else None,
            min_tokens=req.min_tokens, seed=req.seed, stop=stop or None, stop_token_ids=req.stop_token_ids,
            ignore_eos=req.ignore_eos)

    def prepare(self, kind: str, body: bytes) -> _Prepared:
        if kind == "completion":
            req = self._parse(body, CompletionRequest)
            prompt, max_tokens, prompt_param = self._completion_prompt(req), req.max_tokens, "prompt"
        else:
            req = self._parse(body, ChatCompletionRequest)
            prompt, max_tokens, prompt_param = self._chat_prompt(req), req.token_limit(), "messages"
        params = self._params(req, len(prompt), max_tokens, prompt_param)
        prefix = "cmpl" if kind == "completion" else "chatcmpl"
        return _Prepared(kind, f"{prefix}-{uuid.uuid4().hex}", prompt, params, req.stream,
                         bool(req.stream_options and req.stream_options.include_usage))

    # ---- submission -----------------------------------------------------------------------------
    def submit(self, p: _Prepared) -> Any:
        limit = self.config.max_waiting
        if limit is not None and self.engine.stats().waiting >= limit:
            raise APIError(429, f"the server is at capacity ({limit} requests waiting); retry later",
                           code="queue_full", headers={"Retry-After": str(self.config.retry_after_s)})
        try:
            return self.engine.add_request(p.request_id, p.prompt, p.params)
        except ValueError as e:
            raise APIError(400, str(e), param=_field_named(str(e)), code="invalid_value") from e
        except EngineStoppedError as e:
            raise APIError(503, "the server is shutting down", code="shutting_down") from e

    def abort(self, request_id: str) -> None:
        with contextlib.suppress(KeyError):
            self.engine.abort(request_id)

    # ---- answers --------------------------------------------------------------------------------
    async def answer(self, request: Request, kind: str) -> Response:
        arrived = time.perf_counter()
        self.check_auth(request, kind)
        try:
            p = self.prepare(kind, await request.body())
            stream = self.submit(p)
        except APIError as e:
            self.metrics.finished(kind, "rejected" if e.status == 429 else "client_error")
            raise
        progress = _Progress(self.metrics, arrived)
        if p.stream:
            return _EngineStreamResponse(self._events(p, stream, progress), lambda: self._close(p, progress))
        return await self._whole(request, p, stream, progress)

    def _close(self, p: _Prepared, progress: _Progress) -> None:
        if progress.finish_reason is None:
            self.abort(p.request_id)
            outcome = "abort"
        else:
            outcome = progress.finish_reason
        self.metrics.finished(p.kind, outcome if outcome in ("stop", "length") else "abort",
                              progress.prompt_tokens, progress.completion_tokens)

    async def _whole(self, request: Request, p: _Prepared, stream: Any, progress: _Progress) -> Response:
        async def abort_on_disconnect() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass
            self.abort(p.request_id)

        watcher = asyncio.create_task(abort_on_disconnect())
        try:
            async for outs in stream.updates():
                progress.add(merge_outputs(outs))
        finally:
            watcher.cancel()
            self._close(p, progress)
        text, created, usage = "".join(progress.text), int(time.time()), progress.usage()
        if p.kind == "completion":
            body: Any = Completion(id=p.request_id, created=created, model=self.config.model_name, usage=usage,
                                   choices=[CompletionChoice(text=text, finish_reason=progress.finish_reason)])
        else:
            body = ChatCompletion(id=p.request_id, created=created, model=self.config.model_name, usage=usage,
                                  choices=[ChatChoice(message=AssistantMessage(content=text),
                                                      finish_reason=progress.finish_reason)])
        return Response(body.model_dump_json(), media_type="application/json")

    async def _events(self, p: _Prepared, stream: Any, progress: _Progress) -> AsyncIterator[str]:
        chunks = StreamChunks(p.kind, p.request_id, int(time.time()), self.config.model_name)
        if p.kind == "chat":
            yield chunks.role()
        async for outs in stream.updates():         # a client that fell behind gets one event for them all
            out = merge_outputs(outs)
            progress.add(out)
            reason = progress.finish_reason
            if out.new_text or out.new_token_ids or reason is not None:
                yield chunks.delta(out.new_text, reason)
        if p.include_usage:
            yield chunks.usage(progress.usage())
        yield "data: [DONE]\n\n"

    def models(self, request: Request) -> ModelList:
        self.check_auth(request, "models")
        return ModelList(data=[ModelCard(id=self.config.model_name, created=self.created,
                                         max_model_len=self.engine.max_model_len)])


def create_app(engine: Any, config: ServerConfig, manage_engine: bool = True) -> FastAPI:
    """The FastAPI app serving ``engine`` under OpenAI's API.

    ``manage_engine``: start the engine when the app starts and shut it down when it stops.

    Example:
        >>> from opforge.serve import Engine
        >>> from opforge.models.testing import tiny_decoder
        >>> app = create_app(Engine(tiny_decoder()), ServerConfig(model_name="tiny"), manage_engine=False)
        >>> sorted(r.path for r in app.routes if r.path.startswith("/v1"))
        ['/v1/chat/completions', '/v1/completions', '/v1/models', '/v1/models/{model_id}']
    """
    server = OpenAIServer(engine, config)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if manage_engine:
            engine.start()
        try:
            yield
        finally:
            if manage_engine:
                engine.shutdown()

    app = FastAPI(title="opforge", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = server
    install_error_handlers(app)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await server.answer(request, "completion")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await server.answer(request, "chat")

    @app.get("/v1/models")
    async def list_models(request: Request) -> ModelList:
        return server.models(request)

    @app.get("/v1/models/{model_id}")
    async def get_model(model_id: str, request: Request) -> ModelCard:
        cards = server.models(request).data
        if model_id != config.model_name:
            raise APIError(404, f"the model {model_id!r} does not exist", param="model", code="model_not_found")
        return cards[0]

    @app.get("/health")
    async def health() -> JSONResponse:
        s = engine.stats()
        error = getattr(engine, "error", None)          # the step loop stopped on an exception
        body = {"status": "ok" if error is None else f"error: {type(error).__name__}: {error}",
                "running": s.running, "waiting": s.waiting}
        return JSONResponse(body, status_code=200 if error is None else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(server.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes)
    return app
