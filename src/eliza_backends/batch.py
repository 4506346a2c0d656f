"""Many prompts at once over one model load: :func:`generate_batch` and the :class:`BatchLanes` it
runs on.

    from eliza_backends import generate_batch

    out = generate_batch("examples/bundles/tiny", ["Once upon a time", "The river"],
                         max_tokens=32, parallel=2)
    for result in out.results:
        print(result.index, result.error or result.text)
    print(out.stats.completion_tokens_per_second)

The shape follows mlx-lm's ``batch_generate`` (prompts in, texts and statistics out, in the
input's order). Every prompt is its own session on one :class:`InferenceContext` opened with
``parallel=N``: on a backend whose capabilities say ``batched`` (llama.cpp's continuous
batching) the N sessions share one runtime context and every step decodes all of them in one
batch; on any other backend (LiteRT, MLX today) they are N independent sessions, and the batch
says so (``stats.batched`` is False, and an explicit ``parallel`` > 1 logs a warning on
``eliza_backends.batch``). Either way each reply equals the same prompt generated alone.

* **Lanes.** :class:`BatchLanes` runs work on ``parallel`` worker threads ("lanes"), each with
  at most one open stream on the shared context (reopened on the same context, without a reload,
  when an item needs other session settings; rewound with prefix reuse between items, so a
  shared system prompt is prefilled once per lane). Items are taken in input order by
  whichever lane is free; results come back in input order. The Ray Data actor
  (:mod:`eliza_backends.ray.batch`) runs its rows on the same lanes.
* **Threads.** BatchLanes that share one batched runtime context share all of its compute threads:
  every core, or ``config.threads``. Independent sessions split the cores (``cores //
  parallel`` each) unless ``config.threads`` says otherwise, as the server's ``--sessions``
  does.
* **Default parallelism.** :data:`DEFAULT_PARALLEL` on a batching backend (chosen by
  measurement: see the serving guide), capped at the number of prompts; 1 on a backend that
  does not batch (independent sessions splitting the cores were slower than one session with
  all of them: 54.5 vs 82.8 tok/s at 1 client, 61.0 vs 74.8 at 8, SmolLM2 on 2 cores).
* **Failures.** A prompt that fails (empty, too long for the context window, not a prompt at
  all: bytes, a number, None; a template error, a runtime failure, a cancel) fails alone: its
  :class:`BatchResult` carries the :class:`ElizaError` (``error``; ``text`` is what it
  generated before failing, usually empty), its lane's session is reopened if the runtime
  failed, and the other prompts go on. Bad arguments to :func:`generate_batch` itself (a
  ``parallel`` that is not an int >= 1, a config that does not validate, a bundle that cannot
  be served) raise :class:`InvalidArgumentError` (or the backend's error) before anything
  runs. An exception that is not an :class:`ElizaError` is a bug: it is logged with its
  traceback and that prompt fails with a :class:`BackendRuntimeError` caused by it; nothing
  the other prompts computed is lost.

Threads: :func:`generate_batch` blocks its caller; the lanes are its own threads, closed when
it returns. A :class:`BatchLanes` is used by one caller thread at a time.
"""

from __future__ import annotations

import logging
import operator
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, SupportsIndex, TypeVar, cast

from .backend import cpu_count
from .backend.context import InferenceContext
from .config import StreamConfig
from .errors import BackendRuntimeError, ElizaError, InvalidArgumentError
from .stream import Stream, open_stream

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack from Python 3.11

    from .config import StreamOverrides

log = logging.getLogger("eliza_backends.batch")

T = TypeVar("T")
R = TypeVar("R")

#: Sequences decoded together by default on a batching backend (``generate_batch``,
#: ``eliza-backends serve``, the Ray actors): measured on SmolLM2-135M Q4_1 and Gemma 3 270M
#: Q4_K_M on 2 cores, aggregate throughput grows to 8 sequences and is flat past it while each
#: stream's latency keeps growing (docs/guides/openai-server.md has the table).
DEFAULT_PARALLEL = 8

#: A prompt: text (tokenized with BOS where the model uses one), token ids, or chat messages
#: (rendered with the model's template, with the generation prompt).
BatchPrompt = str | Sequence[int] | Sequence[Mapping[str, Any]]


def session_threads(config: StreamConfig, sessions: int, *, shared: bool,
                    cores: int | None = None) -> StreamConfig:
    """``config`` with its compute threads decided: as it says, or (``threads`` None) every
    one of ``cores`` (default: this process's CPUs) when the ``sessions`` share one batched
    runtime context (``shared``), else ``cores // sessions`` each (at least 1), so that
    independent sessions do not oversubscribe the cores."""
    if config.threads is not None:
        return config
    budget = cores or cpu_count()
    return StreamConfig.build(config, threads=max(1, budget if shared else budget // sessions))


def batches(stream: Stream) -> bool:
    """True when ``stream``'s session shares a batched runtime context with the other
    sessions of its context (the backend batches, and the context has ``parallel`` > 1)."""
    return stream.session.capabilities.batched and stream.context.parallel > 1


class BatchLane:
    """One worker thread's hold on the shared context: at most one open stream, opened (or
    reopened with other settings) by :meth:`stream` on the lane's own thread."""

    def __init__(self, lanes: BatchLanes, index: int) -> None:
        self.lanes = lanes
        self.index = index
        self._stream: Stream | None = None
        self._key: object = None

    def stream(self, config: StreamConfig | None = None) -> Stream:
        """The lane's stream, with ``config``'s session settings (default: the lanes' base
        config); a stream with other settings is closed and a new one opened on the same
        context. Raises the backend's :class:`ElizaError` when it cannot open."""
        config = self.lanes.config if config is None else config
        key = self.lanes.key(config)
        if self._stream is None or self._stream.session.closed or key != self._key:
            self.drop()
            self._stream = open_stream(self.lanes.context, config,
                                       backend=self.lanes.backend_request)
            self._key = key
        return self._stream

    def drop(self) -> None:
        """Close the lane's stream (after a runtime failure: the next item opens a new one)."""
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()


class BatchLanes:
    """``parallel`` lanes over one :class:`InferenceContext`: run work on every free lane,
    results in input order (see the module doc).

    ``config``: the base session settings (its ``threads`` decided by :func:`session_threads`
    once the backend is known); ``parallel``: lanes at most (None: :data:`DEFAULT_PARALLEL` on
    a batching backend, 1 on another; never more than the context's ``parallel`` when it
    batches); ``key(config)``: what must be equal for a lane's stream to serve a config
    (default: the config itself); ``cores``: the CPU budget (default: this process's).
    Construction opens lane 0's stream (which tells whether the backend batches); it raises
    the backend's :class:`ElizaError` when the bundle cannot be served. :meth:`close` closes
    the streams (not the context)."""

    def __init__(self, context: InferenceContext, config: StreamConfig | None = None, *,
                 parallel: int | None = None, backend: str | None = None,
                 key: Callable[[StreamConfig], object] | None = None,
                 cores: int | None = None) -> None:
        parallel = _parallel_argument(parallel)
        self.context = context
        self.backend_request = backend
        self.key: Callable[[StreamConfig], object] = key or (lambda c: c)
        base = config or StreamConfig()
        first = BatchLane(self, 0)
        self.config = session_threads(base, 1, shared=True, cores=cores)
        stream = first.stream()
        #: True when the lanes' sessions share one batched runtime context.
        self.batched = batches(stream)
        self.backend = stream.backend
        if self.batched:
            count = min(parallel or DEFAULT_PARALLEL, context.parallel)
        else:
            count = parallel or 1
            self.config = session_threads(base, count, shared=False, cores=cores)
            if count > 1:
                first.drop()  # reopened with its share of the cores
                log.warning("%s does not batch: parallel=%d runs %d independent sessions, "
                            "the cores split %d ways (%d threads each)", self.backend, count,
                            count, count, self.config.threads or 0)
        #: The lanes (at least one).
        self.lanes = [first, *(BatchLane(self, i) for i in range(1, count))]

    @property
    def parallel(self) -> int:
        """How many lanes run at once."""
        return len(self.lanes)

    def map(self, items: Sequence[T], work: Callable[[BatchLane, T], R]) -> list[R]:
        """``work(lane, item)`` for every item, on the lanes' threads (each lane takes the next
        item in input order when it is free); the results in input order. ``work`` handles
        its own failures; an exception that escapes it stops that lane, the others finish
        the items, then the first such exception is raised."""
        results: list[R | None] = [None] * len(items)
        pending = iter(range(len(items)))
        lock = threading.Lock()
        escaped: list[BaseException] = []

        def run(lane: BatchLane) -> None:
            while True:
                with lock:
                    index = next(pending, None)
                if index is None:
                    return
                try:
                    results[index] = work(lane, items[index])
                except BaseException as exc:
                    escaped.append(exc)
                    return

        workers = [threading.Thread(target=run, args=(lane,), daemon=True,
                                    name=f"eliza-lane-{lane.index}")
                   for lane in self.lanes[:max(1, min(len(self.lanes), len(items)))]]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        if escaped:
            raise escaped[0]
        return cast(list[R], results)  # every index was filled

    def close(self) -> None:
        """Close every lane's stream; idempotent. The context stays open."""
        for lane in self.lanes:
            lane.drop()

    def __enter__(self) -> BatchLanes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class BatchResult:
    """One prompt's outcome. Times in seconds, counts in tokens. ``error`` is the
    :class:`ElizaError` the prompt failed with (None when it succeeded); ``text`` is then what
    it generated before failing."""

    index: int
    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    time_to_first_token: float | None = None
    seconds: float = 0.0
    error: ElizaError | None = None

    @property
    def ok(self) -> bool:
        """True when the prompt generated without an error."""
        return self.error is None


@dataclass
class BatchStats:
    """The batch's totals: ``seconds`` is its wall time (sessions opened to last token);
    ``parallel`` how many prompts ran at once; ``batched`` whether they shared one batched
    runtime context (False: independent sessions)."""

    prompts: int
    failed: int
    prompt_tokens: int
    completion_tokens: int
    seconds: float
    parallel: int
    batched: bool
    backend: str

    @property
    def completion_tokens_per_second(self) -> float:
        """Aggregate generated tokens per second of wall time."""
        return self.completion_tokens / self.seconds if self.seconds else 0.0


@dataclass
class BatchResponse:
    """What :func:`generate_batch` returns: one :class:`BatchResult` per prompt, in input
    order, and the :class:`BatchStats`."""

    results: list[BatchResult]
    stats: BatchStats

    @property
    def errors(self) -> list[ElizaError | None]:
        """Every prompt's error (None where it succeeded), in input order."""
        return [r.error for r in self.results]

    @property
    def texts(self) -> list[str]:
        """Every prompt's text, in input order (a failed prompt's: what it generated, usually
        empty; check :attr:`errors` or call :meth:`raise_for_errors`)."""
        return [r.text for r in self.results]

    def raise_for_errors(self) -> None:
        """Raise the first failed prompt's error (None failed: return)."""
        for result in self.results:
            if result.error is not None:
                raise result.error


def _prompt_ids(stream: Stream, prompt: object) -> list[int]:
    """The token ids of one prompt; :class:`InvalidArgumentError` for a prompt of another
    type (bytes, a number, None, a lone message, a list that mixes kinds)."""
    if isinstance(prompt, str):
        return stream.session.tokenize(prompt, add_special=True)
    if isinstance(prompt, bytes | bytearray | memoryview):
        raise InvalidArgumentError("a prompt is text, token ids or chat messages, not bytes: "
                                   "decode the bytes to str, or pass list(token_ids)")
    if isinstance(prompt, Mapping):
        raise InvalidArgumentError("a prompt that is one chat message must be in a list: "
                                   "[{'role': 'user', 'content': ...}]")
    if not isinstance(prompt, Sequence):
        raise InvalidArgumentError(f"a prompt is text, token ids or chat messages, got "
                                   f"{type(prompt).__name__}")
    items = list(prompt)
    if items and all(isinstance(m, Mapping) for m in items):
        return stream.chat_tokens(items)
    for i, item in enumerate(items):
        if isinstance(item, bool) or not isinstance(item, int):
            raise InvalidArgumentError(
                f"a prompt that is a list holds token ids (int) or chat messages (dict), "
                f"not both; item {i} is {type(item).__name__}")
    return items  # token ids: checked against the vocabulary by prefill


def _parallel_argument(parallel: object) -> int | None:
    """``generate_batch``'s ``parallel`` as an int >= 1 (or None); bad values are refused."""
    if parallel is None:
        return None
    integer = hasattr(parallel, "__index__") and not isinstance(parallel, bool)
    count = operator.index(cast(SupportsIndex, parallel)) if integer else 0  # numpy ints too
    if count < 1:
        raise InvalidArgumentError(f"parallel must be an integer >= 1 (or None for the "
                                   f"default), got {parallel!r}")
    return count


def run_prompt(lane: BatchLane, index: int, prompt: BatchPrompt) -> BatchResult:
    """Generate one prompt on ``lane`` (from a fresh turn, reusing the KV prefix the lane's
    session shares with it); an :class:`ElizaError` is carried in the result."""
    result = BatchResult(index)
    t0 = time.perf_counter()
    stream: Stream | None = None
    try:
        stream = lane.stream()
        ids = _prompt_ids(stream, prompt)
        result.prompt_tokens = len(ids)
        stream.set_turn()  # the config's budget and stop strings
        result.cached_tokens = len(ids) - stream.prefill_reusing(ids)
        parts = []
        for step in stream:
            parts.append(step.text)
            result.completion_tokens += len(step.tokens)
            if step.final:
                result.finish_reason = step.finish_reason
        result.text = "".join(parts)
        result.time_to_first_token = stream.metrics.time_to_first_token
    except ElizaError as exc:
        result.error = exc
        if stream is None or stream.session.closed or not isinstance(exc, InvalidArgumentError):
            lane.drop()  # the runtime failed (or was cancelled): the next prompt reopens
    except Exception as exc:  # a bug: this prompt fails with it; the others' results stay
        log.exception("prompt %d failed with an unexpected %s", index, type(exc).__name__)
        result.error = BackendRuntimeError(f"prompt {index} failed: {type(exc).__name__}: "
                                           f"{exc}")
        result.error.__cause__ = exc
        lane.drop()
    result.seconds = time.perf_counter() - t0
    return result


def generate_batch(bundle: str | os.PathLike[str] | InferenceContext,
                   prompts: Sequence[BatchPrompt], *, parallel: int | None = None,
                   backend: str | None = None,
                   config: StreamConfig | Mapping[str, Any] | None = None,
                   **overrides: Unpack[StreamOverrides]) -> BatchResponse:
    """Generate every prompt of ``prompts`` (text, token ids or chat messages), ``parallel``
    at a time on one model load; the texts and statistics in input order (see the module
    doc for batching, threads, defaults and failures).

    ``bundle``: a bundle, a model artifact, or an open :class:`InferenceContext` (whose own
    ``parallel`` then bounds the batch; it is not closed). ``config`` and ``overrides`` (the
    :class:`StreamConfig` fields: ``max_tokens``, ``stop``, sampling...) apply to every
    prompt; with sampling, every prompt uses the config's seed. Raises
    :class:`InvalidArgumentError` for bad arguments and the backend's :class:`ElizaError`
    when the bundle cannot be served."""
    if isinstance(prompts, str | bytes | bytearray) or not isinstance(prompts, Sequence):
        raise InvalidArgumentError("generate_batch() takes a list of prompts (text, token ids "
                                   "or chat messages), not a single prompt")
    parallel = _parallel_argument(parallel)
    cfg = StreamConfig.build(config, **overrides)
    if not prompts:
        raise InvalidArgumentError("generate_batch() needs at least one prompt")
    owns = not isinstance(bundle, InferenceContext)
    if isinstance(bundle, InferenceContext):
        if parallel is not None and parallel > bundle.parallel:
            raise InvalidArgumentError(
                f"parallel={parallel} is more than the InferenceContext's parallel="
                f"{bundle.parallel}; open the context with InferenceContext(bundle, "
                f"parallel={parallel})")
        context = bundle
    else:
        context = InferenceContext(bundle, parallel=min(parallel or DEFAULT_PARALLEL,
                                                        max(1, len(prompts))))
    t0 = time.perf_counter()
    try:
        with BatchLanes(context, cfg, parallel=parallel and min(parallel, len(prompts)),
                   backend=backend) as lanes:
            results = lanes.map(list(enumerate(prompts)),
                                lambda lane, item: run_prompt(lane, *item))
    finally:
        if owns:
            context.close()
    stats = BatchStats(
        prompts=len(results), failed=sum(not r.ok for r in results),
        prompt_tokens=sum(r.prompt_tokens for r in results),
        completion_tokens=sum(r.completion_tokens for r in results),
        seconds=time.perf_counter() - t0, parallel=lanes.parallel, batched=lanes.batched,
        backend=lanes.backend)
    return BatchResponse(results, stats)


__all__ = ["DEFAULT_PARALLEL", "BatchLane", "BatchLanes", "BatchPrompt", "BatchResponse",
           "BatchResult", "BatchStats", "batches", "cpu_count", "generate_batch", "run_prompt",
           "session_threads"]
