"""The one validation layer for ``eliza-backends`` arguments, run before any model loads.

Every bad argument, whether argparse finds it (an unknown flag, ``--port abc``, a missing
positional) or the checks here do (``--port 70000``, ``--log-level bogus``, a sampling flag
StreamConfig refuses, a path that is a symlink loop, ``bundle create`` onto a file, a ``--name``
the manifest cannot hold), is an :class:`~eliza_backends.errors.InvalidArgumentError`: the CLI
prints it as one line (``error: ... [ELIZA_ERR_INVALID_ARG]``) and exits with status 2. Nothing
here imports a runtime or reads more than a path's ``stat``.

Here too: the argparse ``type`` helpers (:func:`int_in`, :func:`float_in`) and the
StreamConfig fields the flags ask for (:func:`config_from_args`), which the checks validate
and the commands open their streams with.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from ..errors import InvalidArgumentError

if TYPE_CHECKING:
    from ..config import StreamConfig

#: uvicorn's log levels that Python's logging knows too (``--log-level``).
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are :class:`InvalidArgumentError` (one line, no
    usage dump) instead of a printed usage and ``SystemExit(2)``; its subparsers are too."""

    def error(self, message: str) -> NoReturn:
        raise InvalidArgumentError(f"{self.prog}: {message} (see {self.prog} --help)")


def int_in(lo: int, hi: int | None = None) -> Callable[[str], int]:
    """An argparse ``type``: an int in ``lo..hi`` (``hi`` None: no upper bound)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < lo or (hi is not None and value > hi):
            span = f"{lo}..{hi}" if hi is not None else f">= {lo}"
            raise argparse.ArgumentTypeError(f"{value} is out of range ({span})")
        return value
    parse.__name__ = "int"
    return parse


def float_in(lo: float, hi: float | None = None) -> Callable[[str], float]:
    """An argparse ``type``: a finite float in ``lo..hi``."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value) or value < lo or (hi is not None and value > hi):
            span = f"{lo}..{hi}" if hi is not None else f">= {lo}"
            raise argparse.ArgumentTypeError(f"{text} is out of range ({span})")
        return value
    parse.__name__ = "float"
    return parse


def check_input(path: str, what: str) -> None:
    """``path`` must be a path that can be followed: no symlink loop, no component that is a
    file, not too long. One that does not exist is left to the command, whose error says
    what it expected there (a ``BundleError``, exit status 1)."""
    try:
        os.stat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise InvalidArgumentError(f"{what} {path}: {exc.strerror or exc}") from None


def check_output_dir(path: str, what: str) -> None:
    """``path`` must be a folder or not exist yet, below a folder: never an existing file, a
    symlink loop or dangling link, or a path below a file."""
    p = Path(path).absolute()
    try:
        # the nearest of path and its parents that is there (a link counts, even a broken one)
        there = next(a for a in (p, *p.parents) if os.path.lexists(a))
        if not there.is_dir():
            why = "is not a folder" if there == p else f"is below {there}, which is not a folder"
            raise InvalidArgumentError(f"{what} {path} {why}; choose a new path or an "
                                       "existing folder")
    except OSError as exc:
        raise InvalidArgumentError(f"{what} {path}: {exc.strerror or exc}") from None


def check_stream_config(fields: dict[str, Any]) -> StreamConfig:
    """The sampling and size flags, validated as the :class:`StreamConfig` they become."""
    from ..config import StreamConfig

    return StreamConfig(**fields)


def config_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The StreamConfig fields the flags ask for (the flags not given are left out);
    ``--option BACKEND:KEY=VALUE`` becomes ``options``, its value parsed as JSON when it can
    be."""
    keys = ["max_tokens", "context_size", "threads", "batch_size", "temperature", "top_k",
            "top_p", "min_p", "repeat_penalty", "seed", "tokens_per_step", "drafter",
            "draft_length", "draft_policy", "ignore_eos"]
    cfg = {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}
    if getattr(args, "stop", None):
        cfg["stop"] = tuple(args.stop)
    if getattr(args, "option", None):
        options: dict[str, dict[str, Any]] = {}
        for item in args.option:
            name, _, rest = item.partition(":")
            key, eq, value = rest.partition("=")
            if not name or not key or not eq:
                raise InvalidArgumentError(f"--option takes BACKEND:KEY=VALUE, got {item!r}")
            try:
                parsed: Any = json.loads(value)
            except ValueError:
                parsed = value
            options.setdefault(name, {})[key] = parsed
        cfg["options"] = options
    return cfg


def check_args(args: argparse.Namespace) -> None:
    """The checks argparse's types cannot make: paths, and values that are only valid
    together (the StreamConfig of :func:`config_from_args`). Raises
    :class:`InvalidArgumentError`."""
    command = getattr(args, "command", None)
    sub = getattr(args, "bundle_command", None)
    if command in ("select", "generate", "chat", "bench", "serve"):
        check_input(args.bundle, "BUNDLE")
    config = check_stream_config(config_from_args(args)) \
        if command in ("generate", "chat", "serve", "bench") else None
    if command == "serve" and args.parallel is not None and (args.sessions or 1) > 1:
        raise InvalidArgumentError(
            f"--sessions {args.sessions} and --parallel {args.parallel}: give one of them "
            "(--parallel N batches N generations in one runtime context sharing every core; "
            "--sessions N runs N independent sessions splitting the cores)")
    if command == "serve" and args.drafter == "mtp" and (args.parallel or 1) > 1:
        raise InvalidArgumentError(
            f"--drafter mtp and --parallel {args.parallel}: the MTP assistant reads its "
            "target's own llama.cpp context, which a batched context shares among sequences; "
            "use --sessions N (N independent sessions, each with its assistant), or --drafter "
            "ngram/model with --parallel")
    if command == "serve" and config is not None and args.parallel is not None and \
            config.batch_size < args.parallel:
        raise InvalidArgumentError(
            f"--batch-size {config.batch_size} is below --parallel {args.parallel}: a batched "
            "step decodes one token of each sequence, so --batch-size must be at least "
            "--parallel")
    if command == "serve" and args.slot_save_path is not None and \
            not os.path.isdir(args.slot_save_path):
        raise InvalidArgumentError(f"--slot-save-path {args.slot_save_path} is not a folder; "
                                   "create it first")
    if command == "bundle" and sub == "verify":
        check_input(args.bundle, "BUNDLE")
    if command == "bundle" and sub == "create":
        check_output_dir(args.out, "OUT")
        for path in [*args.artifacts, *(args.draft or ())]:
            check_input(path, "ARTIFACT")
        if args.name is not None:
            from ..manifest import check_bundle_name

            check_bundle_name(args.name)
    if command == "bundle" and sub == "convert":
        check_input(args.src, "SRC")
        if args.draft is not None:
            check_input(args.draft, "--draft")
        check_output_dir(args.out, "OUT")
        if args.work_dir is not None:
            check_output_dir(args.work_dir, "--work-dir")
        try:
            lengths = [int(n) for n in args.prefill_lengths.split(",")]
        except ValueError:
            lengths = []
        if not lengths or min(lengths) < 1:
            raise InvalidArgumentError(f"--prefill-lengths takes N,N,... of positive ints "
                                       f"(got {args.prefill_lengths!r})")
        if args.name is not None:
            from ..manifest import check_bundle_name

            check_bundle_name(args.name)
        from ..convert.pipeline import parse_plan

        parse_plan(args.formats, args.precision or (), prefill_lengths=tuple(lengths),
                   cache_length=args.cache_length, verify=args.verify, name=args.name,
                   threads=args.threads, litert_tokenizer=args.litert_tokenizer)


__all__ = ["LOG_LEVELS", "Parser", "check_args", "check_input", "check_output_dir",
           "check_stream_config", "config_from_args", "float_in", "int_in"]
