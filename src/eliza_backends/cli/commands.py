"""The commands over backends: ``list``, ``select``, ``generate``, ``bench``, ``serve``.

Each handler takes the parsed arguments (checked by :func:`~eliza_backends.cli.args.check_args`)
and returns the exit code; an :class:`~eliza_backends.errors.ElizaError` it raises is printed
by :func:`eliza_backends.cli.main`. Everything past argparse is imported inside the handler,
so ``--help`` loads nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ..errors import ElizaError
from .args import config_from_args
from .output import EXIT_ERROR, EXIT_OK, cut_notice, print_backends, stats_line


def cmd_list(args: argparse.Namespace) -> int:
    """``list``: the installed backends, and the plugins that failed to load (stderr)."""
    from ..registry import list_backends, plugin_problems

    infos = list_backends()
    problems = plugin_problems()
    if args.json:
        print(json.dumps({"backends": [i.to_dict() for i in infos],
                          "broken_plugins": [p.__dict__ for p in problems]}, indent=2))
        return EXIT_OK
    print_backends(infos)
    for p in problems:
        print(f"broken plugin {p.plugin} ({p.distribution or 'no distribution'}): {p.error}",
              file=sys.stderr)
    if not infos:
        print("no backends installed: pip install 'eliza-backends[all]'", file=sys.stderr)
    return EXIT_OK


def cmd_select(args: argparse.Namespace) -> int:
    """``select``: the backend that would serve the bundle (every verdict with --explain)."""
    from ..selector import explain

    report = explain(args.bundle, backend=args.backend)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    elif args.explain:
        print(report)
    elif report.chosen:
        print(report.chosen)
    if report.error:
        if not args.json:
            print(f"error: {report.error}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


def cmd_generate(args: argparse.Namespace) -> int:
    """``generate``: one completion (or chat reply) streamed to stdout, stats on stderr."""
    from ..media import part_from_file
    from ..stream import open_stream

    media = [part_from_file(p, "image") for p in args.image or ()] + [
        part_from_file(p, "audio") for p in args.audio or ()]  # bad files fail before the load
    with open_stream(args.bundle, backend=args.backend, **config_from_args(args)) as stream:
        if args.chat or media:
            messages: list[dict[str, Any]] = [
                {"role": "system", "content": args.system}] if args.system else []
            content: Any = [*media, {"type": "text", "text": args.prompt}] if media else \
                args.prompt
            stream.prefill_messages([*messages, {"role": "user", "content": content}])
        else:
            if args.system:
                raise SystemExit("--system needs --chat (a plain prompt has no roles)")
            stream.prefill(args.prompt)
        reason = None
        parts: list[str] = []
        for step in stream:
            if not args.json:
                sys.stdout.write(step.text)
                sys.stdout.flush()
            parts.append(step.text)
            reason = step.finish_reason
        if args.json:
            print(json.dumps({"backend": stream.backend, "text": "".join(parts),
                              "finish_reason": reason, "metrics": stream.metrics.to_dict()},
                             indent=2))
        else:
            sys.stdout.write("\n")
            sys.stdout.flush()
        notice = cut_notice(stream, reason)
        if not args.quiet:
            if notice:
                print(notice, file=sys.stderr)
            print(stats_line(stream, reason), file=sys.stderr)
    return EXIT_OK


def _servable_backends(bundle: str) -> list[str]:
    """The available backends that can serve ``bundle`` (``bench``'s default)."""
    from ..registry import list_backends
    from ..selector import select

    backends = []
    for info in list_backends():
        if not info.available:
            continue
        try:
            select(bundle, backend=info.name)
        except ElizaError:
            continue
        backends.append(info.name)
    return backends


def cmd_bench(args: argparse.Namespace) -> int:
    """``bench``: measure backends on a bundle, each run in a fresh process."""
    from ..bench import bench

    backends = args.backend or _servable_backends(args.bundle)
    if not backends:
        print("error: no installed backend can serve this bundle", file=sys.stderr)
        return EXIT_ERROR
    config = {k: getattr(args, k) for k in ("threads", "context_size", "drafter",
                                            "draft_length", "tokens_per_step")
              if getattr(args, k) is not None}
    files = {kind: path for kind, path in (("image", args.image),
                                            ("audio", args.audio)) if path}
    report = bench(args.bundle, backends, prompt_tokens=args.prompt_tokens,
                   gen_tokens=args.gen_tokens, repeat=args.repeat, config=config,
                   progress=None if args.json else sys.stderr,
                   media_rounds=args.media_rounds, media_files=files or None)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report.table())
    return EXIT_ERROR if report.errors and not report.runs else EXIT_OK


def cmd_serve(args: argparse.Namespace) -> int:
    """``serve``: the OpenAI-compatible HTTP server (needs the server extra)."""
    from ..server.serve import missing_extra, serve  # the web stack imports while it loads

    missing = missing_extra()
    if missing is not None:
        print(f"error: the server needs its extra ({missing} is missing): "
              "pip install 'eliza-backends[server]'", file=sys.stderr)
        return EXIT_ERROR
    from ..config import StreamConfig
    from ..server.auth import API_KEY_ENV, check_api_key

    config = StreamConfig(**config_from_args(args))
    api_key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV) or None
    if api_key is not None:
        check_api_key(api_key)  # before the model loads
    try:
        return serve(args.bundle, host=args.host, port=args.port, backend=args.backend,
                     sessions=args.sessions, parallel=args.parallel, queue=args.queue,
                     config=config,
                     model=args.model_name, grace=args.grace, log_format=args.log_format,
                     log_level=args.log_level, allow_media_files=args.allow_media_files,
                     api_key=api_key, warm=not args.no_warmup, cache_ram=args.cache_ram,
                     slot_save_path=args.slot_save_path)
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR


__all__ = ["cmd_bench", "cmd_generate", "cmd_list", "cmd_select", "cmd_serve"]
