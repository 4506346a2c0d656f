"""The OpenAI-compatible server on Ray Serve: :func:`deployment` and :func:`app_builder`.

    from ray import serve
    from eliza_backends.ray.serve import deployment

    serve.run(deployment("examples/bundles/tiny", num_replicas=2, sessions=2))
    # http://127.0.0.1:8000/v1 answers the official openai client

or from the command line, with Ray Serve's own CLI (arguments as ``key=value``, see
:class:`ServeArgs`)::

    serve run eliza_backends.ray.serve:app_builder bundle=/models/tiny num_replicas=2

Each replica (:class:`OpenAIReplica`) is one Ray actor process running exactly what
``eliza-backends serve`` runs: a :class:`~eliza_backends.server.SessionPool` (its own model load,
``parallel`` concurrent generations batched in one runtime context, or ``sessions``
independent ones, and a bounded queue) under the Starlette app of
:func:`~eliza_backends.server.create_app`, so routes (``/v1/responses`` and Anthropic's
``/v1/messages`` too), error bodies, streaming and ``/health`` are the same; each replica has
its own response store, so ``previous_response_id`` finds a response only on the replica that
made it (send ``store: false`` and the whole conversation, or route a client to one replica).
As with ``serve``, neither given means ``parallel="auto"``: 8 sequences decoded together on a
batching backend (llama.cpp), one session on another. Ray Serve's proxy routes requests
to replicas and scales them (``num_replicas``, or ``autoscaling_config``);
``max_ongoing_requests`` defaults to what a pool accepts (its sessions plus its queue), so
Serve queues the rest instead of the pool answering 429.

Every response carries ``x-eliza-backend`` (the backend this replica selected: hosts can
differ) and ``x-eliza-replica`` (``host/pid``); ``/health`` says the same. A replica whose
pool is shutting down fails Serve's health check, and a replica's ``__del__`` (Serve's
graceful shutdown) drains its pool and frees the model. A replica that dies mid-request loses
that request's connection (the client sees a 5xx or a dropped connection and, like the
``openai`` client, retries it); Serve replaces the replica.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from ray import serve
from ray.serve import Application
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..batch import DEFAULT_PARALLEL
from ..config import StreamConfig
from ..openai.embedder import bundle_embedding
from ..server.app import create_app
from ..server.embedding_service import DEFAULT_QUEUE, EmbeddingService
from ..server.pool import SessionPool
from ..serving import model_name
from .resources import reserved_cores

log = logging.getLogger("eliza_backends.ray.serve")


class ReplicaHeaders:
    """ASGI middleware: adds ``x-eliza-backend`` and ``x-eliza-replica`` to every response."""

    def __init__(self, app: ASGIApp, backend: str, replica: str) -> None:
        self.app = app
        self.headers = [(b"x-eliza-backend", backend.encode()),
                        (b"x-eliza-replica", replica.encode())]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *self.headers]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


@serve.ingress()
class OpenAIReplica:
    """One Serve replica: a :class:`SessionPool` over ``bundle`` (an
    :class:`~eliza_backends.server.embedding_service.EmbeddingService` when the bundle is an
    embedding model: ``/v1/embeddings``; loaded and opened in the constructor, so a bundle
    that cannot be served fails the replica at start with its ``ELIZA_*`` error) behind the
    OpenAI app. ``config`` (a :class:`StreamConfig` or its fields), ``sessions``,
    ``parallel``, ``queue``, ``backend`` and ``model`` are
    ``eliza-backends serve``'s; the threads come from the CPUs Ray reserved for the replica.
    ``capacity``: requests Serve may send at once (its ``max_ongoing_requests``): when the
    pool opens fewer sessions than that assumed (``"auto"`` on a backend that does not
    batch), its queue takes the difference, so Serve never gets a 429 it did not cause.
    """

    def __init__(self, bundle: str, *, config: StreamConfig | Mapping[str, Any] | None = None,
                 sessions: int | None = None, parallel: int | Literal["auto"] | None = None,
                 queue: int | None = None, backend: str | None = None,
                 model: str | None = None, grace: float = 10.0,
                 capacity: int | None = None) -> None:
        self.model = model or model_name(bundle)
        self.replica = f"{socket.gethostname()}/{os.getpid()}"
        self.grace = grace
        if parallel is None and sessions is None:
            parallel = "auto"
        base = StreamConfig.build(config)
        self.embeddings: EmbeddingService | None = None
        self.generation: SessionPool | None = None
        self.pool: SessionPool | EmbeddingService
        if bundle_embedding(bundle, backend=backend) is not None:  # an embedding model
            threads = base.threads or reserved_cores()
            self.pool = self.embeddings = EmbeddingService(
                bundle, StreamConfig.build(base, threads=threads), backend=backend,
                max_queue=max(queue or 0, capacity or 0, DEFAULT_QUEUE))
            self.pool.open()
            log.info("replica %s: embedding model %s on %s", self.replica, self.model,
                     self.pool.backend)
            return
        self.pool = self.generation = pool = SessionPool(
            bundle, base, sessions=sessions or 1, parallel=parallel, max_queue=queue,
            backend=backend, cores=reserved_cores())
        pool.open()
        if capacity is not None:
            pool.max_queue = max(pool.max_queue, capacity - len(pool.slots))
        log.info("replica %s: model %s on %s, %s, queue %d", self.replica, self.model,
                 pool.backend, pool.batching, pool.max_queue)

    def __serve_build_asgi_app__(self) -> ASGIApp:
        """Serve's hook: the app this replica serves (called once, after the constructor)."""
        return ReplicaHeaders(create_app(self.generation, model=self.model,
                                         embeddings=self.embeddings), self.pool.backend,
                              self.replica)

    def describe(self) -> dict[str, Any]:
        """Which model, backend and process this replica is (for a deployment handle)."""
        stats = self.generation.stats().to_dict() if self.generation is not None else \
            self.embeddings.stats() if self.embeddings is not None else {}
        return {"model": self.model, "backend": self.pool.backend, "replica": self.replica,
                **stats}

    def check_health(self) -> None:
        """Serve's health check: fails once the pool is draining."""
        if self.pool.draining:
            raise RuntimeError(f"replica {self.replica} is shutting down")

    async def __del__(self) -> None:
        """Serve's graceful shutdown: stop taking requests, give running generations
        ``grace`` seconds, free the sessions and the model."""
        import asyncio

        self.pool.begin_shutdown(self.grace)
        deadline = asyncio.get_running_loop().time() + self.grace + 1
        while self.generation is not None and self.generation.stats().busy and \
                asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        self.pool.close()


class ServeArgs(BaseModel):
    """The arguments of :func:`app_builder` (``serve run ... key=value``)."""

    model_config = ConfigDict(extra="forbid")

    bundle: str = Field(description="The bundle directory (a path every node can read).")
    num_replicas: int = Field(2, ge=1, description="Fixed replica count (unless autoscale).")
    autoscale: bool = Field(False, description="Autoscale between min_replicas and "
                            "max_replicas instead of num_replicas.")
    min_replicas: int = Field(1, ge=0, description="Autoscaling: fewest replicas.")
    max_replicas: int = Field(4, ge=1, description="Autoscaling: most replicas.")
    target_ongoing_requests: float = Field(
        2.0, gt=0, description="Autoscaling: requests per replica it aims at.")
    parallel: int | None = Field(None, ge=1, description="Concurrent generations per "
                                 "replica, batched in one runtime context (default: 8 on a "
                                 "batching backend, else 1); instead of sessions.")
    sessions: int | None = Field(None, ge=1, description="Concurrent generations per replica "
                                 "as independent sessions; instead of parallel.")
    queue: int | None = Field(None, ge=0, description="Requests waiting per replica "
                              "(default 4 per session).")
    num_cpus: float = Field(1.0, gt=0, description="CPUs each replica reserves; its sessions "
                            "share that many threads unless config says threads.")
    backend: str | None = Field(None, description="A hard backend request (default: each "
                                "replica selects its own).")
    model: str | None = Field(None, description="The model id clients use (default: the "
                              "bundle's name).")
    context_size: int | None = Field(None, ge=16, description="KV window per session.")
    name: str = Field("eliza", description="The Serve deployment's name.")


def deployment(bundle: str | os.PathLike[str], *, num_replicas: int | None = 2,
               autoscaling_config: Mapping[str, Any] | None = None,
               sessions: int | None = None, parallel: int | Literal["auto"] | None = None,
               queue: int | None = None, num_cpus: float = 1.0,
               config: StreamConfig | Mapping[str, Any] | None = None,
               backend: str | None = None, model: str | None = None, grace: float = 10.0,
               name: str = "eliza", max_ongoing_requests: int | None = None,
               **options: Any) -> Application:
    """A Serve application of the OpenAI server over ``bundle``, for ``serve.run``.

    ``num_replicas`` fixed replicas, or ``autoscaling_config`` (Serve's dict:
    ``min_replicas``, ``max_replicas``, ``target_ongoing_requests``...; ``num_replicas`` is
    then ignored). Each replica reserves ``num_cpus`` CPUs and runs ``parallel`` generations
    batched in one runtime context sharing that many compute threads, or ``sessions``
    independent sessions dividing them (unless ``config`` says ``threads``; neither given:
    ``parallel="auto"``, counted as 8), with ``queue`` more requests waiting (default: 4 per
    session). ``max_ongoing_requests`` (default sessions + queue) is how many requests Serve
    sends one replica at once. ``options``: any other option of ``serve.deployment``
    (``health_check_period_s``, ``ray_actor_options``...). Asking for both ``sessions`` > 1
    and ``parallel`` raises :class:`InvalidArgumentError` in the replica."""
    if parallel is None and sessions is None:
        parallel = "auto"
    slots = sessions or (DEFAULT_PARALLEL if parallel in (None, "auto") else int(parallel))
    waiting = 4 * slots if queue is None else queue
    actor_options = {"num_cpus": num_cpus, **options.pop("ray_actor_options", {})}
    scaling: dict[str, Any] = ({"autoscaling_config": dict(autoscaling_config)}
                               if autoscaling_config is not None
                               else {"num_replicas": num_replicas})
    capacity = max_ongoing_requests or slots + waiting
    replica = serve.deployment(
        name=name, max_ongoing_requests=capacity,
        ray_actor_options=actor_options, **scaling, **options)(OpenAIReplica)
    app: Application = replica.bind(str(Path(bundle).resolve()), config=config,
                                    sessions=sessions, parallel=parallel, queue=waiting,
                                    backend=backend, model=model, grace=grace,
                                    capacity=capacity)
    return app


def app_builder(args: ServeArgs | Mapping[str, Any]) -> Application:
    """Ray Serve's application builder: ``serve run eliza_backends.ray.serve:app_builder
    bundle=PATH [num_replicas=N | autoscale=true min_replicas=.. max_replicas=..] ...``.
    ``args``: a :class:`ServeArgs`, or the ``key=value`` strings Serve's CLI (or a config
    file's ``args``) passes, validated into one (an unknown key is an error)."""
    args = args if isinstance(args, ServeArgs) else ServeArgs.model_validate(dict(args))
    autoscaling = None if not args.autoscale else {
        "min_replicas": args.min_replicas, "max_replicas": args.max_replicas,
        "target_ongoing_requests": args.target_ongoing_requests}
    config = {"context_size": args.context_size} if args.context_size else None
    return deployment(args.bundle, num_replicas=args.num_replicas,
                      autoscaling_config=autoscaling, sessions=args.sessions,
                      parallel=args.parallel, queue=args.queue,
                      num_cpus=args.num_cpus, config=config, backend=args.backend,
                      model=args.model, name=args.name)


__all__ = ["OpenAIReplica", "ReplicaHeaders", "ServeArgs", "app_builder", "deployment"]
