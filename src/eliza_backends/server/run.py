"""One request's generation on a leased session: the core driven on the slot's thread, its
answer whole or as server-sent events.

A route turns its request into the core's :class:`~eliza_backends.openai.generation.GenerationJob`,
leases a session and starts it with :func:`start_choice`: one job on the slot's thread (or the
stepping thread of a batched context) prefills the first choice's prompt and goes straight on
to its steps (:meth:`Lease.start_steps`). A :class:`GenerationRun` then reads the steps (and
starts the other choices so), formats them with the route's
:class:`~eliza_backends.openai.formatting.Formatter` (the OpenAI routes':
:class:`~eliza_backends.openai.formatting.Responder`; ``/v1/responses``':
:class:`~eliza_backends.openai.responses_events.ResponsesFormatter`)
and gives the lease back exactly once, however the answer ends (finished, failed, cancelled,
the client gone: :class:`GenerationResponse`).
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NamedTuple

from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from ..config import StreamConfig
from ..errors import CancelledError
from ..openai.formatting import Formatter
from ..openai.generation import Generation, GenerationJob
from ..stream import Stream
from .api_errors import ApiError, api_error, sse
from .pool import Lease


class GenerationResponse(StreamingResponse):
    """A server-sent-events response that releases its lease however the response ends
    (finished, client gone before the first byte, server shutting down)."""

    def __init__(self, content: AsyncIterator[bytes], lease: Lease) -> None:
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.lease = lease

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if not self.lease.released:  # ended before the events did: the client went away
                self.lease.cancel("the client went away")
                self.lease.release()


class Started(NamedTuple):
    """A started choice."""

    #: the live generation (its steps change it on their thread)
    generation: Generation
    #: a snapshot of it as it started
    opened: Generation
    #: each step's text and a snapshot of the generation right after it, as they come
    steps: AsyncIterator[tuple[str, Generation]]


async def start_choice(lease: Lease, job: GenerationJob, config: StreamConfig) -> Started:
    """Start one choice of ``job`` on ``lease`` (its prompt prefilled: a prompt error is
    raised here) with its steps running on at once (see :meth:`Lease.start_steps`)."""
    def start(stream: Stream) -> tuple[Generation, Generation]:
        gen = Generation.of_job(stream, job)
        gen.start()
        return gen, copy.copy(gen)  # (the snapshot before any step changes it)

    (gen, opened), steps = await lease.start_steps(start, config, lambda pair: _stepper(pair[0]),
                                                   _last_step)
    return Started(gen, opened, steps)


class GenerationRun:
    """One request's choices on one lease, after its first choice started: runs the rest,
    logs how it ended and gives the lease back (with the text it holds) exactly once per path.
    Owned by the request's task; the lease's slot thread runs the steps."""

    def __init__(self, job: GenerationJob, include_usage: bool, configs: list[StreamConfig],
                 lease: Lease, first: Started, log: dict[str, Any], routing: str,
                 responder: Formatter) -> None:
        self.job, self.include_usage, self.configs = job, include_usage, configs
        self.lease, self.log = lease, log
        self.routing, self.responder = routing, responder
        self.first = first.generation
        self._first: Started | None = first
        self.finished: list[Generation] = []

    async def choices(self) -> AsyncIterator[tuple[int, Generation, str | None]]:
        """(index, generation, text): text None opens a choice (a snapshot of the generation
        as it started), then each step's text with a snapshot of the generation after that
        step (the steps run ahead of the consumer: :meth:`Lease.start_steps`)."""
        for index in range(self.job.n):
            started, self._first = self._first, None
            gen, opened, steps = started or await start_choice(self.lease, self.job,
                                                               self.configs[index])
            yield index, opened, None
            pool = self.lease.pool
            counted = (opened.completion_tokens, opened.drafted_tokens, opened.accepted_tokens)
            async for text, seen in steps:
                now = (seen.completion_tokens, seen.drafted_tokens, seen.accepted_tokens)
                pool.count_tokens(*(a - b for a, b in zip(now, counted, strict=True)))
                counted = now
                yield index, seen, text
            self.finished.append(gen)

    def _last(self) -> Generation:
        return self.finished[-1] if self.finished else self.first

    def note_end(self, outcome: str) -> None:
        last = self._last()
        self.log.update(completion_tokens=sum(g.completion_tokens for g in self.finished) or
                        last.completion_tokens, finish=last.finish_reason, outcome=outcome)
        if last.first_token_at is not None and last.started_at is not None:
            self.log["ttft_ms"] = round((last.first_token_at - last.started_at) * 1000, 1)

    def held_text(self) -> str:
        return self.routing + self._last().text

    async def whole(self, watch: Awaitable[None]) -> Response:
        """The non-streamed answer; ``watch`` (cancelling the lease on a disconnect) runs
        alongside the generation."""
        lease = self.lease
        watcher = asyncio.ensure_future(watch)
        try:
            async for _ in self.choices():
                pass
        except Exception as exc:
            self.note_end("cancelled" if isinstance(exc, CancelledError) else "error")
            if isinstance(exc, CancelledError) and lease.cancel_reason is not None:
                return self.error_response(ApiError(
                    499 if "client" in lease.cancel_reason else 503,
                    f"generation stopped: {lease.cancel_reason}", type="server_error",
                    code="cancelled"))
            raise
        finally:
            watcher.cancel()
            freed = lease.release(self.held_text())
        self.note_end("ok")
        await freed
        return JSONResponse(self.responder.final(self.finished).model_dump(exclude_none=True))

    def error_response(self, error: ApiError) -> Response:
        """``error`` as an HTTP response in the route's error shape."""
        return JSONResponse(self.responder.error_body(error.status, error.detail, False),
                            status_code=error.status, headers=error.headers)

    def _event(self, data: Any) -> bytes:
        name = getattr(data, "type", None) if self.responder.named_events else None
        return sse(data, event=name)

    async def events(self) -> AsyncIterator[bytes]:
        """The server-sent events of a streamed answer."""
        responder, lease, outcome = self.responder, self.lease, "cancelled"
        try:
            async for index, gen, text in self.choices():
                encoded = None if text is None else responder.step_json(index, text, gen)
                if encoded is not None:  # (a running answer's text: no models built)
                    yield f"data: {encoded}\n\n".encode()
                    continue
                events = responder.opening(index, gen) if text is None else \
                    responder.step(index, text, gen)
                for event in events:
                    yield self._event(event)
            for event in responder.closing(self.finished, self.include_usage):
                yield self._event(event)
            await lease.release(self.held_text())
            if responder.done_marker is not None:
                yield sse(responder.done_marker)
            outcome = "ok"
        except Exception as exc:
            if isinstance(exc, CancelledError) and lease.cancel_reason is not None:
                error = ApiError(503, f"generation stopped: {lease.cancel_reason}",
                                 type="server_error", code="cancelled")
            else:
                outcome, error = "error", api_error(exc)
            body = responder.error_body(error.status, error.detail, True)
            yield sse(body, event="error" if responder.named_events else None)
        finally:
            self.note_end(outcome)
            lease.release(self.held_text())


def _last_step(out: tuple[str, Generation]) -> bool:
    return out[1].done


def _stepper(gen: Generation) -> Callable[[Stream], tuple[str, Generation]]:
    """The slot-thread work of one step of ``gen``: its text, and a snapshot of ``gen`` right
    after it (the next step may be running while the event loop reads this one's finish
    reason, logprobs and tool calls)."""
    def step(_stream: Stream) -> tuple[str, Generation]:
        text = gen.step()
        return text, copy.copy(gen)
    return step


__all__ = ["Formatter", "GenerationResponse", "GenerationRun", "Started", "start_choice"]
