"""Batch generation on Ray Data: :class:`BatchGenerator` and :func:`generate`.

    import ray
    from eliza_backends.ray import generate

    prompts = ray.data.from_items([{"id": i, "messages": [{"role": "user", "content": q}]}
                                   for i, q in enumerate(questions)])
    answers = generate(prompts, "examples/bundles/tiny", actors=2, max_tokens=64)
    for row in answers.iter_rows():
        print(row["id"], row["backend"], row["error"] or row["text"])

Each Ray Data actor constructs one :class:`BatchGenerator`: one :class:`InferenceContext`
opened with ``parallel=N``, the model loaded once, and the N lanes of
:func:`~eliza_backends.generate_batch` (:class:`~eliza_backends.batch.BatchLanes`) on it. A batch's
rows run N at a time, one lane each: on a batching backend (llama.cpp) the N sequences share
one runtime context and are decoded together, one batch per step, so a batch of rows is one
batched generation; on another backend (``parallel`` defaults to 1 there) the lanes are
independent sessions. Each lane keeps one open stream (reopened on the same context when a row
needs other sampling settings), whose KV cache the lane's next row reuses as far as its prompt
shares a prefix (a common system prompt is prefilled once per lane, not once per row). Each
row is one OpenAI request run through the in-process API
(:func:`~eliza_backends.chat_completion` / :func:`~eliza_backends.completion` on its lane's
stream), so a row gives exactly what the same call gives in process, and accepts the same
fields.

Rows in, rows out:

* the request: a ``messages`` column (a chat completion) or a ``prompt`` column (a text
  completion: text or token ids), plus any column named like a field of the OpenAI request
  (``max_tokens``, ``temperature``, ``top_p``, ``seed``, ``stop``, ``n``, ...); a null cell
  takes the default given to the generator. Every other column passes through unchanged.
* the result columns (:data:`RESULT_COLUMNS`): ``text`` (the first choice's text),
  ``finish_reason``, ``prompt_tokens``, ``completion_tokens``, ``response`` (the whole OpenAI
  response as JSON), ``error`` and ``error_code`` (null when the row succeeded), and ``backend``
  and ``worker`` (which backend served the row, on which ``host/pid``: the selection runs on
  each worker, so a cluster of mixed hosts reports it per row).

A row that fails (a request that does not validate, a prompt that does not fit the context
window, a backend failure) gets its ``error`` and ``error_code`` (the ``ELIZA_*`` symbol, or
the OpenAI ``code`` of a validation error) and null results; the other rows and the job go
on. A bundle that cannot be loaded at all fails the actor when it starts, which fails the
job: every row would fail the same way. Cancelling the job kills the actors, and with their
processes the models they loaded.

This module needs ``pyarrow`` (Ray Data's own dependency) only when a batch is converted, and
Ray only in :func:`generate`; :class:`BatchGenerator` itself runs without a cluster.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..backend.context import InferenceContext
from ..batch import DEFAULT_PARALLEL, BatchLane, BatchLanes
from ..config import StreamConfig
from ..errors import ElizaError, InvalidArgumentError
from ..openai.local import chat_completion, completion
from ..openai.types import (
    ChatChoice,
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    RequestError,
    parse_request,
)
from ..serving import model_name, serving_config, session_config, session_key
from .resources import reserved_cores

if TYPE_CHECKING:
    import pyarrow as pa
    from ray.data import Dataset

#: Columns a batch gains, with their Arrow types (the same in every batch, failed rows null).
RESULT_COLUMNS: dict[str, str] = {
    "text": "string", "finish_reason": "string", "prompt_tokens": "int64",
    "completion_tokens": "int64", "response": "string", "error": "string",
    "error_code": "string", "backend": "string", "worker": "string"}

#: Row columns that are request fields (``model`` and ``stream`` are the generator's own).
REQUEST_FIELDS = frozenset(
    set(ChatCompletionRequest.model_fields) | set(CompletionRequest.model_fields)
) - {"model", "stream"}


def _plain(value: Any) -> Any:
    """A cell as plain Python: numpy arrays and scalars (from a ``numpy`` batch) to lists and
    numbers, and None for the nulls of a struct (a message without ``name``) dropped."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if v is not None}
    return value


def batch_rows(batch: Any) -> list[dict[str, Any]]:
    """The rows of a Ray Data batch in any of its formats: a ``pyarrow.Table`` (recommended:
    nulls stay None), a ``pandas.DataFrame`` or a dict of numpy arrays."""
    if hasattr(batch, "to_pylist"):  # pyarrow.Table
        rows: list[dict[str, Any]] = batch.to_pylist()
        return rows
    if hasattr(batch, "to_dict") and hasattr(batch, "columns"):  # pandas.DataFrame
        import pyarrow as pa

        return batch_rows(pa.Table.from_pandas(batch, preserve_index=False))
    columns = {name: list(values) for name, values in batch.items()}
    count = len(next(iter(columns.values()), []))
    return [{name: values[i] for name, values in columns.items()} for i in range(count)]


class BatchGenerator:
    """A Ray Data callable class: ``dataset.map_batches(BatchGenerator, batch_format="pyarrow",
    fn_constructor_kwargs={"bundle": ...}, compute=ray.data.ActorPoolStrategy(size=2))``.

    ``bundle``: the bundle directory (on a cluster, a path every worker can read). ``config``:
    the sessions' base settings (context size, threads, backend options, default sampling;
    without ``threads``, on a Ray actor, the CPUs Ray reserved for it: shared by the lanes of
    a batched context, divided among independent ones); ``parallel``: rows generated at once
    (default: :data:`~eliza_backends.batch.DEFAULT_PARALLEL` on a batching backend, 1 on
    another); ``backend``: a hard backend request (else each worker selects its own);
    ``model``: the id the responses name (default: the bundle's). ``defaults``: request fields
    every row gets unless its own column says otherwise (e.g. ``max_tokens=64``).

    Construction loads the model and opens one session (raising the backend's
    :class:`ElizaError` when the bundle cannot be served). One instance serves one caller
    thread at a time (Ray Data calls an actor's ``__call__`` serially); its lanes are its own
    threads. :meth:`close` frees the model.
    """

    def __init__(self, bundle: str | os.PathLike[str], *,
                 config: StreamConfig | Mapping[str, Any] | None = None,
                 backend: str | None = None, model: str | None = None,
                 parallel: int | None = None, **defaults: Any) -> None:
        unknown = sorted(set(defaults) - REQUEST_FIELDS)
        if unknown:
            raise InvalidArgumentError(
                f"unknown request fields {unknown}: the defaults are OpenAI request fields "
                f"({', '.join(sorted(REQUEST_FIELDS))})")
        self.defaults = {k: _plain(v) for k, v in defaults.items() if v is not None}
        self.model = model or model_name(bundle)
        self.worker = f"{socket.gethostname()}/{os.getpid()}"
        self.context = InferenceContext(bundle, parallel=parallel or DEFAULT_PARALLEL)
        try:
            self.lanes = BatchLanes(self.context, serving_config(config), parallel=parallel,
                               backend=backend, key=session_key, cores=reserved_cores())
        except BaseException:
            self.context.close()
            raise
        #: the rows' base config (its threads decided by the lanes)
        self.base = self.lanes.config
        self.backend = self.lanes.backend

    def complete(self, row: Mapping[str, Any], lane: BatchLane | None = None
                 ) -> ChatCompletion | Completion:
        """The OpenAI response for one row (see the module doc for the columns it reads), on
        ``lane`` (default: the first; call it from one thread per lane). Raises
        :class:`InvalidArgumentError` (:class:`RequestError` for a request that does not
        validate) or the backend's :class:`ElizaError`."""
        lane = lane or self.lanes.lanes[0]
        data = dict(self.defaults)
        data.update({k: _plain(v) for k, v in row.items() if k in REQUEST_FIELDS and v is not None})
        chat = "messages" in data
        if chat == ("prompt" in data):
            raise RequestError("a row needs exactly one of a `messages` column (chat) or a "
                               "`prompt` column (text completion)", param="messages")
        request = parse_request(ChatCompletionRequest if chat else CompletionRequest, data)
        config = session_config(self.base, request)
        if request.n > 1 and not config.greedy:
            raise RequestError("n > 1 with sampling is not supported in a batch: give each "
                               "choice its own row with its own seed", param="n")
        stream = lane.stream(config)
        try:
            response: ChatCompletion | Completion = (
                chat_completion(stream, model=self.model, **data) if chat
                else completion(stream, model=self.model, **data))
            return response
        except InvalidArgumentError:
            raise  # checked before anything ran: the session is intact
        except BaseException:
            lane.drop()  # the next row on this lane opens a new session
            raise

    def result(self, row: Mapping[str, Any], lane: BatchLane | None = None) -> dict[str, Any]:
        """The result columns (:data:`RESULT_COLUMNS`) for one row (on ``lane``, as
        :meth:`complete`); a failure is reported in ``error`` / ``error_code``, never
        raised."""
        out: dict[str, Any] = dict.fromkeys(RESULT_COLUMNS)
        out.update(backend=self.backend, worker=self.worker)
        try:
            response = self.complete(row, lane)
        except RequestError as exc:
            out.update(error=exc.message, error_code=exc.error_code or "invalid_request_error")
            return out
        except ElizaError as exc:
            out.update(error=exc.message, error_code=exc.code.symbol)
            return out
        except Exception as exc:  # a bug: still this row's, not the job's
            out.update(error=f"{type(exc).__name__}: {exc}", error_code="internal_error")
            return out
        first = response.choices[0]
        text = first.message.content if isinstance(first, ChatChoice) else first.text
        usage = response.usage
        out.update(text=text, finish_reason=first.finish_reason,
                   prompt_tokens=usage.prompt_tokens if usage else None,
                   completion_tokens=usage.completion_tokens if usage else None,
                   response=response.model_dump_json(exclude_none=True))
        return out

    def __call__(self, batch: Any) -> pa.Table:
        """Ray Data's entry point: the batch (any format) with the result columns added
        (replacing input columns of the same names), as a ``pyarrow.Table``."""
        import pyarrow as pa

        rows = batch_rows(batch)
        results = self.lanes.map(rows, lambda lane, row: self.result(row, lane))
        table = batch if isinstance(batch, pa.Table) else pa.Table.from_pylist(rows)
        for name, kind in RESULT_COLUMNS.items():
            if name in table.column_names:
                table = table.drop_columns([name])
            table = table.append_column(
                name, pa.array([r[name] for r in results], type=pa.type_for_alias(kind)))
        return table

    def close(self) -> None:
        """Close the lanes' streams and free the model; idempotent."""
        self.lanes.close()
        self.context.close()

    def __enter__(self) -> BatchGenerator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def generate(dataset: Dataset, bundle: str | os.PathLike[str], *,
             actors: int | tuple[int, int] = 1, cpus_per_actor: float = 1.0,
             batch_size: int = 16, config: StreamConfig | Mapping[str, Any] | None = None,
             backend: str | None = None, model: str | None = None, preserve_order: bool = True,
             parallel: int | None = None, **defaults: Any) -> Dataset:
    """``dataset`` with every row generated (the result columns of the module doc), on
    ``actors`` Ray actors (a number, or ``(min, max)`` for an autoscaling pool), each reserving
    ``cpus_per_actor`` CPUs and running its sessions on that many threads (unless ``config``
    says ``threads``). ``batch_size`` rows go to an actor at a time. ``preserve_order`` keeps
    the output rows in the input's order (Ray Data otherwise yields batches as they finish).
    ``parallel`` (rows generated at once on each actor, batched on a batching backend),
    ``config``, ``backend``, ``model`` and ``defaults`` are :class:`BatchGenerator`'s.

    Lazy, like every Ray Data transform: nothing runs until the result is consumed
    (``take_all``, ``iter_rows``, ``write_parquet``...)."""
    import ray.data

    size = (actors, actors) if isinstance(actors, int) else actors
    generated = dataset.map_batches(
        BatchGenerator, batch_format="pyarrow", batch_size=batch_size,
        compute=ray.data.ActorPoolStrategy(min_size=size[0], max_size=size[1]),
        num_cpus=cpus_per_actor,
        fn_constructor_kwargs={"bundle": str(Path(bundle).resolve()), "config": config,
                               "backend": backend, "model": model, "parallel": parallel,
                               **defaults})
    if preserve_order:  # this dataset's own context (a copy of the driver's)
        generated.context.execution_options.preserve_order = True
    return generated


__all__ = ["REQUEST_FIELDS", "RESULT_COLUMNS", "BatchGenerator", "batch_rows", "generate"]
