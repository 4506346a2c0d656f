"""What the ``eliza-backends`` commands print, and the exit codes they return.

Generated text goes to stdout as it streams; stats, notices, logs and errors go to stderr.
``--json`` prints one JSON document on stdout instead of the text (an error too, as
``{"error": {"code": ..., "message": ...}}``, besides the line on stderr).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..errors import ElizaError
    from ..stream import Stream

#: Exit codes: ok, an ElizaError (one line), bad usage (one line, before any load), Ctrl-C.
EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def print_backends(infos: Sequence[Any]) -> None:
    """The backends as a table that fits the terminal (80 columns when not a terminal): one
    row per backend, its notes wrapped on indented lines below it."""
    import shutil
    import textwrap

    width = shutil.get_terminal_size((80, 24)).columns
    rows = [[i.name, "yes" if i.available else "no", str(i.rank), ", ".join(i.formats),
             f"{i.distribution or '-'} {i.version or ''}".strip()] for i in infos]
    headers = ["backend", "available", "rank", "serves", "distribution"]
    widths = [max(len(h), *(len(r[k]) for r in rows)) if rows else len(h)
              for k, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip())
    for info, row in zip(infos, rows, strict=True):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        notes = [f"aliases: {', '.join(info.aliases)}"] if info.aliases else []
        note = info.reason if not info.available else info.rank_reason
        if note:
            notes.append(note)
        for text in notes:
            print(textwrap.fill(text, width=max(width - 1, 40), initial_indent="    ",
                                subsequent_indent="    ", break_on_hyphens=False))


def stats_line(stream: Stream, reason: str | None) -> str:
    """One line of a turn's measurements, for stderr."""
    m = stream.metrics
    rate = m.acceptance_rate
    spec = f", drafted {m.drafted}, accepted {m.accepted} ({rate:.0%})" if rate is not None \
        else ""
    ttft = f"{m.time_to_first_token * 1000:.1f} ms" if m.time_to_first_token else "-"
    return (f"[{stream.backend}] prompt {m.prefill_tokens} tok "
            f"({m.prefill_tokens_per_second:.1f} tok/s), generated {m.decode_tokens} tok "
            f"({m.decode_tokens_per_second:.1f} tok/s), first token {ttft}{spec}, "
            f"finish: {reason}")


def cut_notice(stream: Stream, reason: str | None) -> str | None:
    """The stderr notice for a reply cut by the token budget (None when it ended by itself)."""
    if reason != "length":
        return None
    return (f"[reply cut at {stream.config.max_tokens} tokens (--max-tokens); raise it for "
            "more]")


def print_json_error(exc: ElizaError) -> None:
    """``--json``'s error document on stdout."""
    print(json.dumps({"error": {"code": exc.code.symbol, "message": exc.message}}, indent=2))


__all__ = ["EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE", "cut_notice",
           "print_backends", "print_json_error", "stats_line"]
