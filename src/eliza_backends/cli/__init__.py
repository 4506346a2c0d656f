"""The ``eliza-backends`` command line.

    eliza-backends [--version] [-v | -q] COMMAND ...
    eliza-backends list [--json]
    eliza-backends select BUNDLE [--backend NAME] [--explain] [--json]
    eliza-backends generate BUNDLE PROMPT [--chat [--system TEXT]] [--max-tokens N] [--json]
                            [--backend NAME] [sampling flags]
    eliza-backends chat BUNDLE [--backend NAME] [--system TEXT]
    eliza-backends bench BUNDLE [--backend NAME]... [--prompt-tokens N] [--gen-tokens N]
                         [--repeat N] [--json]
    eliza-backends serve BUNDLE [--host 127.0.0.1] [--port 8000] [--backend NAME]
                         [--parallel N | --sessions N]
    eliza-backends bundle create OUT ARTIFACT... [--draft ARTIFACT] [--name NAME] [--link]
                                 [--json]
    eliza-backends bundle verify BUNDLE [--no-hash] [--json]
    eliza-backends bundle convert SRC OUT [--formats gguf,mlx,litert,coreml] [--draft DIR]
                         [--precision FORMAT=P,...]... [--prefill-lengths N,...]
                         [--cache-length N] [--verify] [--work-dir DIR]

BUNDLE is a bundle folder, or a single model artifact (a .gguf / .litertlm / .tflite file, an
MLX folder), taken as an implicit one-artifact bundle.

Exit codes: 0 ok, 1 an ElizaError (printed as one line), 2 bad usage (one line too, with
``ELIZA_ERR_INVALID_ARG``: every argument is checked by :mod:`eliza_backends.cli.args` before
any model loads), 130 interrupted.
Generated text goes to stdout as it streams; stats, notices, logs and errors go to stderr.
``--json`` prints one JSON document on stdout instead of the text (an error too, as
``{"error": {"code": ..., "message": ...}}``, besides the line on stderr).

The package by job: :mod:`~eliza_backends.cli.parser` (the argparse tables),
:mod:`~eliza_backends.cli.args` (argument checks, the StreamConfig the flags ask for),
:mod:`~eliza_backends.cli.commands` (``list``, ``select``, ``generate``, ``bench``, ``serve``),
:mod:`~eliza_backends.cli.bundle_commands` (``bundle create``, ``verify``, ``convert``),
:mod:`~eliza_backends.cli.chat` (the ``chat`` REPL), :mod:`~eliza_backends.cli.output` (what
the commands print, the exit codes), :mod:`~eliza_backends.cli.log_setup` (``-v`` / ``-q``,
the native loggers the installed plugins declare). This module holds :func:`main`, the entry
point of the console script and of ``python -m eliza_backends``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from ..errors import ElizaError, InvalidArgumentError
from .args import check_args
from .chat import _chat_command as _chat_command
from .log_setup import configure_logging
from .output import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, print_json_error
from .parser import _STREAM_FLAGS as _STREAM_FLAGS
from .parser import build_parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``eliza-backends`` command: parse and check ``argv`` (default:
    ``sys.argv[1:]``), configure logging, run the command; the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        check_args(args)
    except InvalidArgumentError as exc:  # bad usage: one line, before any model loads
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    configure_logging(args.verbose, args.quiet, native=getattr(args, "loads_runtime", True))
    try:
        code: int = args.func(args)
        return code
    except ElizaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if getattr(args, "json", False):
            print_json_error(exc)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK


__all__ = ["EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE", "build_parser",
           "configure_logging", "main"]
