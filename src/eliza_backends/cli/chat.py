"""``eliza-backends chat``: a conversation in the terminal, with the model's chat template.

The REPL reads a message (a line, or the lines between two ``\"\"\"`` lines; readline editing
and history in ``$XDG_STATE_HOME/eliza-backends/chat_history`` on a terminal), streams the
reply to stdout from a worker thread, and keeps the conversation as messages; ``/reset``,
``/save FILE``, ``/load FILE``, ``/image PATH``, ``/audio PATH`` (attached to the next message)
and ``/quit`` are commands (:data:`CHAT_HELP`). Ctrl-C stops a
reply and keeps what was said (the stream's tokens stay, so the next turn reuses its prefix);
Ctrl-C at the prompt or Ctrl-D leaves.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import (
    CancelledError,
    ElizaError,
    MediaError,
    SlotError,
    UnsupportedOperationError,
)
from .args import config_from_args
from .output import EXIT_OK, cut_notice

if TYPE_CHECKING:
    from ..stream import Stream


CHAT_HELP = ("/reset starts over, /save FILE and /load FILE keep the conversation, /image PATH "
             "and /audio PATH attach a file to your next message, /quit or Ctrl-D leaves; "
             "Ctrl-C stops a reply; \"\"\" starts and ends a multi-line message")


def _history_file() -> Path:
    """Where the chat REPL keeps its readline history."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local",
                                                             "state")
    return Path(state) / "eliza-backends" / "chat_history"


def _enable_line_editing() -> Path | None:
    """Turn on readline (line editing, history) for ``input()``; the history file, or None
    where readline is missing."""
    try:
        import readline
    except ImportError:
        return None
    path = _history_file()
    with contextlib.suppress(OSError):
        readline.read_history_file(path)
    readline.set_history_length(1000)
    return path


def _save_history(path: Path | None) -> None:
    if path is None:
        return
    import readline

    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        readline.write_history_file(path)


def _read_message(interactive: bool) -> str | None:
    """One user message: a line, or the lines between two ``\"\"\"`` lines. None at end of
    input. Ctrl-C at the prompt raises KeyboardInterrupt."""
    def line(prompt: str) -> str | None:
        if interactive:
            try:
                return input(prompt)
            except EOFError:  # Ctrl-D: end the prompt's line before leaving
                sys.stdout.write("\n")
                return None
        text = sys.stdin.readline()
        return text.rstrip("\n") if text else None

    first = line(">>> ")
    if first is None or not first.strip().startswith('"""'):
        return first
    lines = [first.strip()[3:]]
    if lines[0].endswith('"""'):
        return lines[0][:-3]
    while (more := line("... ")) is not None:
        if more.rstrip().endswith('"""'):
            lines.append(more.rstrip()[:-3])
            break
        lines.append(more)
    return "\n".join(lines).strip("\n")


def _stream_reply(stream: Stream, messages: list[dict[str, Any]]) -> tuple[str, str | None, int]:
    """Prefill the conversation and generate the reply in a worker thread, writing the reply
    to stdout as it streams. The first Ctrl-C (SIGINT) cancels the reply, whose text so far is
    kept; a second one while it stops raises KeyboardInterrupt. Returns the text, the finish
    reason (``"cancelled"`` when stopped) and the number of tokens prefilled."""
    import queue
    import signal

    steps: queue.Queue[Any] = queue.Queue()
    prefilled = [0]
    cancelled = threading.Event()

    def produce() -> None:
        try:
            prefilled[0] = stream.prefill_messages(messages)
            for step in stream:
                steps.put(step)
        except BaseException as exc:  # handed to the consumer thread
            steps.put(exc)
        steps.put(None)

    def on_sigint(signum: int, frame: object) -> None:
        if cancelled.is_set():
            raise KeyboardInterrupt
        cancelled.set()
        stream.cancel()

    previous = signal.signal(signal.SIGINT, on_sigint)
    worker = threading.Thread(target=produce, name="eliza-chat-reply", daemon=True)
    parts: list[str] = []
    reason: str | None = None
    try:
        worker.start()
        while (item := steps.get()) is not None:
            if isinstance(item, CancelledError):
                continue
            if isinstance(item, BaseException):
                raise item
            sys.stdout.write(item.text)
            sys.stdout.flush()
            parts.append(item.text)
            reason = item.finish_reason
    finally:
        signal.signal(signal.SIGINT, previous)
    worker.join()
    if cancelled.is_set():
        reason = "cancelled"
        stream.reset_keep(stream.session.n_past)  # clear the cancel, keep every token
    sys.stdout.write("\n")
    sys.stdout.flush()
    return "".join(parts), reason, prefilled[0]


def _save_conversation(stream: Stream, messages: list[dict[str, Any]], path: str) -> str:
    """``/save``: the slot (KV state + tokens) at ``path``, the messages beside it. The
    messages file is written first (a path that cannot take it fails before the slot)."""
    try:
        Path(path + ".messages.json").write_text(json.dumps(messages, indent=1) + "\n",
                                                 encoding="utf-8")
    except OSError as exc:
        raise SlotError(f"cannot write {path}.messages.json ({exc.strerror or exc}); /save "
                        "takes a file name in a folder you can write to") from None
    stream.save_slot(path)
    return f"[saved {len(messages)} messages, {stream.session.n_past} tokens to {path}]"


def _load_conversation(stream: Stream, path: str) -> tuple[list[dict[str, Any]], str]:
    """``/load``: restore a ``/save``; the messages, and the notice to print."""
    try:
        loaded = json.loads(Path(path + ".messages.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:  # (absurd nesting: RecursionError)
        raise SlotError(f"cannot read {path}.messages.json ({exc}); /load takes a file "
                        "written by /save") from None
    if not isinstance(loaded, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str) for m in loaded):
        raise SlotError(f"{path}.messages.json is not a list of chat messages")
    stream.restore_slot(path)
    return loaded, f"[loaded {len(loaded)} messages, {stream.session.n_past} tokens from {path}]"


def _attach(stream: Stream, kind: str, path: str, pending: list[dict[str, Any]]) -> str:
    """``/image`` / ``/audio``: the file, checked now, as a content part of the next message."""
    from ..media import part_from_file

    if not path:
        return f"[/{kind} takes a file name]"
    takes = stream.session.capabilities.media
    if kind not in takes:
        return (f"[this {stream.backend} session takes no {kind} input (it takes "
                f"{', '.join(sorted(takes)) or 'text only'})]")
    try:
        pending.append(part_from_file(path, kind))  # type: ignore[arg-type]
    except ElizaError as exc:
        return f"[/{kind} failed: {exc}]"
    return f"[{kind} {path} attached to your next message]"


def _chat_command(stream: Stream, line: str, messages: list[dict[str, Any]],
                  system: list[dict[str, Any]], pending: list[dict[str, Any]] | None = None
                  ) -> tuple[list[dict[str, Any]], str] | None:
    """Run a ``/command``: the new messages and a notice, or None for ``/quit``. ``pending``:
    the media parts attached to the next message (the REPL's list; None: a fresh one)."""
    if pending is None:
        pending = []
    name, _, arg = line.strip().partition(" ")
    arg = arg.strip()
    if name in ("/quit", "/exit", "/bye"):
        return None
    if name in ("/image", "/audio"):
        return messages, _attach(stream, name[1:], arg, pending)
    if name == "/reset":
        stream.reset()
        pending.clear()
        return list(system), "[conversation reset]"
    if name in ("/save", "/load") and not arg:
        return messages, f"[{name} takes a file name]"
    try:
        if name == "/save":
            return messages, _save_conversation(stream, messages, arg)
        if name == "/load":
            return _load_conversation(stream, arg)
    except (ElizaError, OSError) as exc:  # the conversation stays as it was
        return messages, f"[{name} failed: {exc}]"
    return messages, f"[unknown command {name}; {CHAT_HELP}]"


def cmd_chat(args: argparse.Namespace) -> int:
    """``chat``: the REPL on one stream, until ``/quit``, Ctrl-D or Ctrl-C at the prompt."""
    from ..stream import open_stream

    system = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(system)
    interactive = sys.stdin.isatty()
    history = _enable_line_editing() if interactive else None
    with open_stream(args.bundle, backend=args.backend, **config_from_args(args)) as stream:
        print(f"[{stream.backend}] chatting with {args.bundle}; {CHAT_HELP}", file=sys.stderr)
        try:
            _chat_loop(stream, messages, system, interactive, quiet=args.quiet)
        finally:
            _save_history(history)
    return EXIT_OK


def _chat_loop(stream: Stream, messages: list[dict[str, Any]], system: list[dict[str, Any]],
               interactive: bool, *, quiet: bool) -> None:
    """Read, run a command or stream a reply, print its notices; until the user leaves."""
    pending: list[dict[str, Any]] = []  # media attached to the next message
    while True:
        try:
            line = _read_message(interactive)
        except KeyboardInterrupt:  # Ctrl-C at the prompt: leave
            sys.stdout.write("\n")
            return
        if line is None:
            return
        if line.strip().startswith("/"):
            outcome = _chat_command(stream, line, messages, system, pending)
            if outcome is None:
                return
            messages, notice = outcome
            print(notice, file=sys.stderr)
            continue
        if not line.strip():
            continue
        content: Any = [*pending, {"type": "text", "text": line}] if pending else line
        pending.clear()
        messages.append({"role": "user", "content": content})
        try:
            reply, reason, new = _stream_reply(stream, messages)
        except KeyboardInterrupt:
            return
        except (MediaError, UnsupportedOperationError) as exc:  # the message could not be used:
            # nothing reached the session and the conversation stays
            messages.pop()
            print(f"[that message failed: {exc}]", file=sys.stderr)
            continue
        messages.append({"role": "assistant", "content": reply})
        if reason == "cancelled":
            print("[reply stopped; the conversation keeps what was said]", file=sys.stderr)
        elif (cut := cut_notice(stream, reason)) is not None:
            print(cut, file=sys.stderr)
        if not quiet:
            ttft = (stream.metrics.time_to_first_token or 0) * 1000
            print(f"[prefilled {new} new tokens, first token {ttft:.1f} ms]", file=sys.stderr)


__all__ = ["CHAT_HELP", "cmd_chat"]
