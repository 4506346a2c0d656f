"""The OpenAI-compatible HTTP API, as a Starlette ASGI application over a :class:`SessionPool`.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions`` and ``POST /v1/responses`` (JSON,
or server-sent events with ``"stream": true``; stored responses at ``GET`` / ``DELETE
/v1/responses/{id}``), Anthropic's ``POST /v1/messages`` (and ``/v1/messages/count_tokens``),
``POST /v1/embeddings``, ``GET /v1/models`` (and ``/v1/models/{id}``), ``GET /health``. A
server of a generation model has a :class:`SessionPool`; one of an embedding model an
:class:`~eliza_backends.server.embedding_service.EmbeddingService`, and each answers the
other's routes with a 400 (``code: ELIZA_ERR_UNSUPPORTED``).

Errors have OpenAI's body, ``{"error": {"message", "type", "param", "code"}}`` (Anthropic's,
``{"type": "error", "error": {"type", "message"}}``, on ``/v1/messages``):

=====  ==========================================================================
400    a request that does not validate (unknown field, wrong type, empty messages,
       ``max_tokens`` < 1, an unsupported feature), or that cannot fit the context
       window (``code: context_length_exceeded``); ``code`` is the ``ELIZA_*``
       symbol when the check was the backend's
401    no API key, or a wrong one, on a server started with one (``code: invalid_api_key``;
       every route but ``/health``)
404    an unknown route, or a ``model`` this server does not serve (``model_not_found``)
413    a body over the size limit
429    every session busy and the wait queue full (``Retry-After`` says when to retry)
500    a backend failure (``code``: its ``ELIZA_*`` symbol) or a bug; the server goes on
503    shutting down
=====  ==========================================================================

A failure after a stream has started is sent as a last event ``data: {"error": {...}}``.
The mapping is :func:`~eliza_backends.server.api_errors.api_error`'s; each route parses and
checks its request, turns it into the core's job through its front-end
(:mod:`eliza_backends.openai.chat`, :mod:`eliza_backends.openai.completions`) and answers
through :mod:`eliza_backends.server.run` with the OpenAI
:class:`~eliza_backends.openai.formatting.Responder`.
A client that disconnects cancels its generation within one step; the session is rewound and
returned to the pool. Every request is logged to ``eliza_backends.server.access`` with its
fields in the record's ``access`` attribute (see :mod:`eliza_backends.server.serve`).

:func:`create_app` only builds the app: the pool's lifecycle (``open`` / ``close``) belongs to
whoever runs it (``eliza-backends serve``, or another ASGI host).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..media import MediaLimits
from ..openai import chat, completions
from ..openai.formatting import Formatter, Responder
from ..openai.generation import Generation, GenerationJob
from ..openai.response_store import ResponseStore
from ..openai.types import (
    ChatCompletionRequest,
    CompletionRequest,
    ModelCard,
    ModelList,
    parse_request,
    validate_body,
)
from .api_errors import ApiError, api_error, sse
from .auth import ApiKeyGuard
from .pool import Lease, SessionPool
from .run import GenerationResponse, GenerationRun, start_choice
from .slot_files import SlotFiles

if TYPE_CHECKING:
    from .embedding_service import EmbeddingService

access_log = logging.getLogger("eliza_backends.server.access")

#: Largest request body accepted, in bytes.
MAX_BODY = 8 << 20
_LOG_KEY = "eliza.access"


class AccessLog:
    """ASGI middleware: one ``eliza_backends.server.access`` record per HTTP request, with
    method, path, status, duration and whatever the handler put in the request's log dict
    (tokens, time to first token, finish reason, session slot, outcome)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        info: dict[str, Any] = {}
        scope[_LOG_KEY] = info
        status = [0]
        start = time.perf_counter()

        async def send_and_note(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            client = scope.get("client")
            fields = {"client": f"{client[0]}:{client[1]}" if client else None,
                      "method": scope["method"], "path": scope["path"], "status": status[0],
                      "duration_ms": round((time.perf_counter() - start) * 1000, 1), **info}
            extras = " ".join(f"{k}={v}" for k, v in info.items())
            access_log.info("%s %s %s %s %.1fms %s", fields["client"], fields["method"],
                            fields["path"], fields["status"], fields["duration_ms"], extras,
                            extra={"access": fields})


class OpenAIServer:
    """The routes over one pool. ``model`` is the id the server answers to and names;
    ``media``: the limits on requests' images and audio (None: the defaults, no local
    files). ``pool`` serves a generation model, ``embeddings`` an embedding model: one of
    them."""

    def __init__(self, pool: SessionPool | None, model: str, *, max_body: int = MAX_BODY,
                 media: MediaLimits | None = None,
                 response_store: ResponseStore | None = None,
                 embeddings: EmbeddingService | None = None) -> None:
        if (pool is None) == (embeddings is None):
            raise ValueError("OpenAIServer serves a SessionPool or an EmbeddingService: one")
        self._pool = pool
        self.embeddings = embeddings
        self.media = media
        self.model = model
        self.max_body = max_body
        #: the responses ``previous_response_id`` and ``GET /v1/responses/{id}`` find
        self.response_store = response_store if response_store is not None else ResponseStore()
        self.created = int(time.time())

    # ------------------------------------------------------------------ plain routes

    @property
    def pool(self) -> SessionPool:
        """The generation pool; a 400 on a server of an embedding model."""
        if self._pool is None:
            raise ApiError(400, f"this server serves the embedding model {self.model!r}: it "
                           "makes vectors (POST /v1/embeddings), not text; serve a generation "
                           "model's bundle for completions", code="ELIZA_ERR_UNSUPPORTED")
        return self._pool

    async def health(self, request: Request) -> Response:
        if self.embeddings is not None:
            info = self.embeddings.stats()
            return JSONResponse({"status": "draining" if info["draining"] else "ok",
                                 "model": self.model, "backend": self.embeddings.backend,
                                 **info}, status_code=503 if info["draining"] else 200)
        stats = self.pool.stats()
        return JSONResponse({"status": "draining" if stats.draining else "ok",
                             "model": self.model, "backend": self.pool.backend,
                             **stats.to_dict()},
                            status_code=503 if stats.draining else 200)

    def _card(self) -> ModelCard:
        return ModelCard(id=self.model, created=self.created)

    async def models(self, request: Request) -> Response:
        return JSONResponse(ModelList(data=[self._card()]).model_dump())

    async def model_card(self, request: Request) -> Response:
        if request.path_params["model"] != self.model:
            raise self._unknown_model(request.path_params["model"])
        return JSONResponse(self._card().model_dump())

    def _unknown_model(self, name: str) -> ApiError:
        return ApiError(404, f"this server serves the model {self.model!r}, not {name!r}; pass "
                        f"model={self.model!r} (see GET /v1/models)", param="model",
                        code="model_not_found")

    # ------------------------------------------------------------------ completions

    async def _body(self, request: Request) -> bytes:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            raise ApiError(413, f"the request body is {length} bytes; the limit is "
                           f"{self.max_body}")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > self.max_body:
                raise ApiError(413, f"the request body is over the limit of {self.max_body} "
                               "bytes")
        return bytes(body)  # decoded and validated by parse_request

    async def chat_completions(self, request: Request) -> Response:
        try:
            req = parse_request(ChatCompletionRequest, await self._body(request))
            self._check_model(req.model)
            routing = chat.prompt_text(req, self.pool.chat_template, self.pool.template_tokens,
                                       self.model)
            return await self._generate(request, chat.chat_job(req, self.media),
                                        Responder("chat", self.model), routing, req.stream,
                                        req.include_usage)
        except Exception as exc:
            return self._fail(request, exc, chat.PROMPT_PARAM)

    async def completions(self, request: Request) -> Response:
        try:
            req = parse_request(CompletionRequest, await self._body(request))
            self._check_model(req.model)
            routing = completions.prompt_text(req)
            return await self._generate(request, completions.completion_job(req),
                                        Responder("text", self.model), routing, req.stream,
                                        req.include_usage)
        except Exception as exc:
            return self._fail(request, exc, completions.PROMPT_PARAM)

    # ------------------------------------------------------------------ responses

    async def responses(self, request: Request) -> Response:
        """``POST /v1/responses``: the Responses front-end (:mod:`eliza_backends.openai.responses`)
        over the same core, stored in :attr:`response_store` when ``store``."""
        from ..openai import responses
        from ..openai.responses_events import ResponsesFormatter
        from ..openai.responses_types import ResponsesRequest

        try:
            req = validate_body(ResponsesRequest, await self._body(request))
            self._check_model(req.model)
            plan = responses.responses_plan(req, self.response_store)
            routing = chat.prompt_text(plan.chat, self.pool.chat_template,
                                       self.pool.template_tokens, self.model)
            formatter = ResponsesFormatter(req, self.model, plan.conversation,
                                           self.response_store)
            return await self._generate(request, plan.job, formatter, routing, req.stream,
                                        False)
        except Exception as exc:
            return self._fail(request, exc, responses.PROMPT_PARAM)

    async def stored_response(self, request: Request) -> Response:
        """``GET`` / ``DELETE /v1/responses/{id}``: a stored response, or forget it."""
        response_id = request.path_params["response_id"]
        entry = self.response_store.get(response_id)
        if entry is None:
            return ApiError(404, f"no stored response {response_id!r} (made with store: false, "
                            "deleted, evicted, or the server restarted)",
                            param="response_id", code="not_found").response()
        if request.method == "DELETE":
            from ..openai.responses_types import ResponseDeleted

            self.response_store.delete(response_id)
            return JSONResponse(ResponseDeleted(id=response_id).model_dump())
        return JSONResponse(entry.response.model_dump(exclude_none=True))

    # ------------------------------------------------------------------ Anthropic messages

    async def messages(self, request: Request) -> Response:
        """``POST /v1/messages``: Anthropic's Messages API
        (:mod:`eliza_backends.openai.anthropic_messages`) over the same core, with Anthropic's
        events and error bodies."""
        from ..openai import anthropic_messages
        from ..openai.anthropic_events import MessagesFormatter
        from ..openai.anthropic_types import MessagesRequest
        from ..openai.anthropic_types import error_body as anthropic_error_body

        try:
            req = validate_body(MessagesRequest, await self._body(request))
            self._check_model(req.model)
            chat_req = anthropic_messages.chat_request(req)
            routing = chat.prompt_text(chat_req, self.pool.chat_template,
                                       self.pool.template_tokens, self.model)
            return await self._generate(request, chat.chat_job(chat_req),
                                        MessagesFormatter(req, self.model), routing,
                                        req.stream, False)
        except Exception as exc:
            return self._fail(request, exc, anthropic_messages.PROMPT_PARAM,
                              anthropic_error_body)

    async def count_tokens(self, request: Request) -> Response:
        """``POST /v1/messages/count_tokens``: the prompt's tokens as ``/v1/messages`` would
        prefill them (template, tools), tokenized on a leased session."""
        from ..openai import anthropic_messages
        from ..openai.anthropic_types import MessagesRequest, TokenCount
        from ..openai.anthropic_types import error_body as anthropic_error_body

        try:
            req = validate_body(MessagesRequest, await self._body(request))
            self._check_model(req.model)
            job = chat.chat_job(anthropic_messages.chat_request(req, need_budget=False))
            config = job.session_config(self.pool.config)
            lease = await self.pool.acquire("", config)
            try:
                length = await lease.call(lambda stream: Generation.of_job(stream, job)
                                          .prompt_length())
            finally:
                await lease.release(lease.slot.text)
            return JSONResponse(TokenCount(input_tokens=length).model_dump())
        except Exception as exc:
            return self._fail(request, exc, anthropic_messages.PROMPT_PARAM,
                              anthropic_error_body)

    # ------------------------------------------------------------------ embeddings

    async def create_embeddings(self, request: Request) -> Response:
        """``POST /v1/embeddings`` (:mod:`eliza_backends.openai.embeddings`) on the
        :class:`EmbeddingService`; a 400 on a server of a generation model."""
        from ..openai.embeddings import EmbeddingRequest

        try:
            req = validate_body(EmbeddingRequest, await self._body(request))
            self._check_model(req.model)
            if self.embeddings is None:
                raise ApiError(400, f"this server serves the generation model {self.model!r},"
                               " which makes no embeddings; serve an embedding model's bundle "
                               "(a GGUF with a pooling type, such as EmbeddingGemma) for "
                               "/v1/embeddings", code="ELIZA_ERR_UNSUPPORTED")
            reply = await self.embeddings.run(req, self.model)
            request.scope[_LOG_KEY]["prompt_tokens"] = reply.usage.prompt_tokens
            return JSONResponse(reply.model_dump())
        except Exception as exc:
            return self._fail(request, exc, "input")

    def _check_model(self, name: str | None) -> None:
        if name is not None and name != self.model:
            raise self._unknown_model(name)

    def _fail(self, request: Request, exc: BaseException, param: str,
              shape: Callable[[int, str], dict[str, Any]] | None = None) -> Response:
        """The error response of ``exc``: OpenAI's body, or ``shape(status, message)``'s."""
        error = api_error(exc, prompt_param=param)
        request.scope[_LOG_KEY]["error"] = error.detail.code or error.detail.type
        if shape is None:
            return error.response()
        return JSONResponse(shape(error.status, error.detail.message),
                            status_code=error.status, headers=error.headers)

    async def _generate(self, request: Request, job: GenerationJob, responder: Formatter,
                        routing: str, stream: bool, include_usage: bool) -> Response:
        """Starts ``job`` on a leased session (its first choice's prompt is decoded before
        this returns, so prompt errors become plain HTTP errors) and answers it, whole or
        streamed (``stream``), in ``responder``'s shapes."""
        log: dict[str, Any] = request.scope[_LOG_KEY]
        configs = [job.session_config(self.pool.config, i) for i in range(job.n)]
        lease = await self.pool.acquire(routing, configs[0])
        log["slot"] = lease.slot.index
        try:
            first = await start_choice(lease, job, configs[0])
        except BaseException:
            lease.release()
            raise
        gen = first.generation
        log["prompt_tokens"], log["cached_tokens"] = gen.prompt_tokens, gen.cached_tokens
        run = GenerationRun(job, include_usage, configs, lease, first, log, routing, responder)
        if not stream:
            return await run.whole(self._cancel_on_disconnect(request, lease))
        return GenerationResponse(run.events(), lease)

    async def _cancel_on_disconnect(self, request: Request, lease: Lease) -> None:
        """Cancel ``lease`` when the client of a non-streamed request disconnects."""
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                lease.cancel("the client went away")
                return


def create_app(pool: SessionPool | None, *, model: str, max_body: int = MAX_BODY,
               media: MediaLimits | None = None, api_key: str | None = None,
               embeddings: EmbeddingService | None = None,
               slot_save_path: str | os.PathLike[str] | None = None) -> ASGIApp:
    """The ASGI application serving ``pool`` (a generation model) or ``embeddings`` (an
    embedding model; then ``pool`` is None) under the model id ``model`` (with access logs);
    ``media``: the limits on requests' images and audio (see :class:`OpenAIServer`);
    ``slot_save_path``: the folder of ``POST /slots/{id}?action=save|restore``'s files
    (:mod:`~eliza_backends.server.slot_files`; None: only ``erase``; a pool's only).
    With ``api_key``, every request but ``GET /health`` must carry it, else 401
    (:class:`~eliza_backends.server.auth.ApiKeyGuard`; refused requests are logged too).

    The pool must be open; closing it is the caller's job."""
    server = OpenAIServer(pool, model, max_body=max_body, media=media, embeddings=embeddings)

    async def not_found(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        message = (f"no route {request.method} {request.url.path}; this server has "
                   "/v1/chat/completions, /v1/completions, /v1/responses, /v1/messages, "
                   "/v1/embeddings, /v1/models, /slots/{id} and /health"
                   if status in (404, 405) else str(exc))
        return ApiError(status, message, code="not_found" if status == 404 else None
                        ).response()

    async def crashed(request: Request, exc: Exception) -> Response:
        return api_error(exc).response()

    handlers: dict[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
        HTTPException: not_found, Exception: crashed}
    app = Starlette(routes=[
        Route("/health", server.health, methods=["GET"]),
        Route("/v1/models", server.models, methods=["GET"]),
        Route("/v1/models/{model:path}", server.model_card, methods=["GET"]),
        Route("/v1/chat/completions", server.chat_completions, methods=["POST"]),
        Route("/v1/completions", server.completions, methods=["POST"]),
        Route("/v1/responses", server.responses, methods=["POST"]),
        Route("/v1/responses/{response_id}", server.stored_response,
              methods=["GET", "DELETE"]),
        Route("/v1/messages", server.messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", server.count_tokens, methods=["POST"]),
        Route("/v1/embeddings", server.create_embeddings, methods=["POST"]),
        *([Route("/slots/{id:int}", SlotFiles(pool, slot_save_path).action,
                 methods=["POST"])] if pool is not None else []),
    ], exception_handlers=handlers)
    app.state.server = server
    return AccessLog(ApiKeyGuard(app, api_key) if api_key else app)


__all__ = ["MAX_BODY", "AccessLog", "ApiError", "GenerationResponse", "OpenAIServer",
           "api_error", "create_app", "sse"]
