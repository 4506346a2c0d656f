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
``ELIZA_ERR_INVALID_ARG``: every argument is checked by :mod:`eliza_backends.cli_args` before
any model loads), 130 interrupted.
Generated text goes to stdout as it streams; stats, notices, logs and errors go to stderr.
``--json`` prints one JSON document on stdout instead of the text (an error too, as
``{"error": {"code": ..., "message": ...}}``, besides the line on stderr).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .cli_args import LOG_LEVELS, Parser, check_args, float_in, int_in
from .errors import ElizaError, InvalidArgumentError

if TYPE_CHECKING:
    from .stream import Stream

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def _print_backends(infos: Sequence[Any]) -> None:
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


def cmd_list(args: argparse.Namespace) -> int:
    from .registry import list_backends, plugin_problems

    infos = list_backends()
    problems = plugin_problems()
    if args.json:
        print(json.dumps({"backends": [i.to_dict() for i in infos],
                          "broken_plugins": [p.__dict__ for p in problems]}, indent=2))
        return EXIT_OK
    _print_backends(infos)
    for p in problems:
        print(f"broken plugin {p.plugin} ({p.distribution or 'no distribution'}): {p.error}",
              file=sys.stderr)
    if not infos:
        print("no backends installed: pip install 'eliza-backends[all]'", file=sys.stderr)
    return EXIT_OK


def cmd_select(args: argparse.Namespace) -> int:
    from .selector import explain

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


def _config_from_args(args: argparse.Namespace) -> dict[str, Any]:
    keys = ["max_tokens", "context_size", "threads", "batch_size", "temperature", "top_k",
            "top_p", "min_p", "repeat_penalty", "seed", "tokens_per_step", "drafter",
            "draft_length", "ignore_eos"]
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


def _stats_line(stream: Stream, reason: str | None) -> str:
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


def _cut_notice(stream: Stream, reason: str | None) -> str | None:
    """The stderr notice for a reply cut by the token budget (None when it ended by itself)."""
    if reason != "length":
        return None
    return (f"[reply cut at {stream.config.max_tokens} tokens (--max-tokens); raise it for "
            "more]")


def cmd_generate(args: argparse.Namespace) -> int:
    from .stream import open_stream

    with open_stream(args.bundle, backend=args.backend, **_config_from_args(args)) as stream:
        if args.chat:
            messages = [{"role": "system", "content": args.system}] if args.system else []
            stream.prefill_messages([*messages, {"role": "user", "content": args.prompt}])
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
        notice = _cut_notice(stream, reason)
        if not args.quiet:
            if notice:
                print(notice, file=sys.stderr)
            print(_stats_line(stream, reason), file=sys.stderr)
    return EXIT_OK


CHAT_HELP = ("/reset starts over, /save FILE and /load FILE keep the conversation, /quit or "
             "Ctrl-D leaves; Ctrl-C stops a reply; \"\"\" starts and ends a multi-line message")


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


def _stream_reply(stream: Stream, messages: list[dict[str, str]]) -> tuple[str, str | None, int]:
    """Prefill the conversation and generate the reply in a worker thread, writing the reply
    to stdout as it streams. The first Ctrl-C (SIGINT) cancels the reply, whose text so far is
    kept; a second one while it stops raises KeyboardInterrupt. Returns the text, the finish
    reason (``"cancelled"`` when stopped) and the number of tokens prefilled."""
    import queue
    import signal

    from .errors import CancelledError

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


def _save_conversation(stream: Stream, messages: list[dict[str, str]], path: str) -> str:
    """``/save``: the slot (KV state + tokens) at ``path``, the messages beside it. The
    messages file is written first (a path that cannot take it fails before the slot)."""
    from .errors import SlotError

    try:
        Path(path + ".messages.json").write_text(json.dumps(messages, indent=1) + "\n",
                                                 encoding="utf-8")
    except OSError as exc:
        raise SlotError(f"cannot write {path}.messages.json ({exc.strerror or exc}); /save "
                        "takes a file name in a folder you can write to") from None
    stream.save_slot(path)
    return f"[saved {len(messages)} messages, {stream.session.n_past} tokens to {path}]"


def _load_conversation(stream: Stream, path: str) -> tuple[list[dict[str, str]], str]:
    """``/load``: restore a ``/save``; the messages, and the notice to print."""
    from .errors import SlotError

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


def _chat_command(stream: Stream, line: str, messages: list[dict[str, str]],
                  system: list[dict[str, str]]) -> tuple[list[dict[str, str]], str] | None:
    """Run a ``/command``: the new messages and a notice, or None for ``/quit``."""
    from .errors import ElizaError

    name, _, arg = line.strip().partition(" ")
    arg = arg.strip()
    if name in ("/quit", "/exit", "/bye"):
        return None
    if name == "/reset":
        stream.reset()
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
    from .stream import open_stream

    system = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(system)
    interactive = sys.stdin.isatty()
    history = _enable_line_editing() if interactive else None
    with open_stream(args.bundle, backend=args.backend, **_config_from_args(args)) as stream:
        print(f"[{stream.backend}] chatting with {args.bundle}; {CHAT_HELP}", file=sys.stderr)
        try:
            _chat_loop(stream, messages, system, interactive, quiet=args.quiet)
        finally:
            _save_history(history)
    return EXIT_OK


def _chat_loop(stream: Stream, messages: list[dict[str, str]], system: list[dict[str, str]],
               interactive: bool, *, quiet: bool) -> None:
    while True:
        try:
            line = _read_message(interactive)
        except KeyboardInterrupt:  # Ctrl-C at the prompt: leave
            sys.stdout.write("\n")
            return
        if line is None:
            return
        if line.strip().startswith("/"):
            outcome = _chat_command(stream, line, messages, system)
            if outcome is None:
                return
            messages, notice = outcome
            print(notice, file=sys.stderr)
            continue
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line})
        try:
            reply, reason, new = _stream_reply(stream, messages)
        except KeyboardInterrupt:
            return
        messages.append({"role": "assistant", "content": reply})
        if reason == "cancelled":
            print("[reply stopped; the conversation keeps what was said]", file=sys.stderr)
        elif (cut := _cut_notice(stream, reason)) is not None:
            print(cut, file=sys.stderr)
        if not quiet:
            ttft = (stream.metrics.time_to_first_token or 0) * 1000
            print(f"[prefilled {new} new tokens, first token {ttft:.1f} ms]", file=sys.stderr)


def cmd_bench(args: argparse.Namespace) -> int:
    from .bench import bench
    from .registry import list_backends
    from .selector import select

    if args.backend:
        backends = args.backend
    else:
        backends = []
        for info in list_backends():
            if not info.available:
                continue
            try:
                select(args.bundle, backend=info.name)
            except ElizaError:
                continue
            backends.append(info.name)
    if not backends:
        print("error: no installed backend can serve this bundle", file=sys.stderr)
        return EXIT_ERROR
    config = {k: getattr(args, k) for k in ("threads", "context_size", "drafter",
                                            "draft_length", "tokens_per_step")
              if getattr(args, k) is not None}
    report = bench(args.bundle, backends, prompt_tokens=args.prompt_tokens,
                   gen_tokens=args.gen_tokens, repeat=args.repeat, config=config,
                   progress=None if args.json else sys.stderr)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report.table())
    return EXIT_ERROR if report.errors and not report.runs else EXIT_OK


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        from .server.serve import serve
    except ImportError as exc:
        print(f"error: the server needs its extra ({exc.name} is missing): "
              "pip install 'eliza-backends[server]'", file=sys.stderr)
        return EXIT_ERROR
    from .config import StreamConfig

    config = StreamConfig(**_config_from_args(args))
    try:
        return serve(args.bundle, host=args.host, port=args.port, backend=args.backend,
                     sessions=args.sessions, parallel=args.parallel, queue=args.queue,
                     config=config,
                     model=args.model_name, grace=args.grace, log_format=args.log_format,
                     log_level=args.log_level)
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR


def cmd_bundle_create(args: argparse.Namespace) -> int:
    from .bundle import create_bundle

    manifest = create_bundle(args.out, args.artifacts, drafts=args.draft or (), name=args.name,
                             link=args.link)
    if args.json:
        print(manifest.model_dump_json(indent=2))
    else:
        for art in manifest.artifacts:
            print(f"{art.path}  {art.format}  {art.backend or '-'}  {art.role}  {art.size} bytes")
    print(f"wrote {args.out}/manifest.json", file=sys.stderr)
    return EXIT_OK


def cmd_bundle_verify(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .bundle import verify_bundle

    manifest = verify_bundle(args.bundle, hashes=not args.no_hash)
    n = sum(len(a.files) for a in manifest.artifacts)
    parity_path = Path(args.bundle) / "parity.json"
    parity: dict[str, Any] | None = None
    if parity_path.is_file():
        try:
            parity = json.loads(parity_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            print(f"error: {parity_path} is unreadable: {exc}", file=sys.stderr)
            return EXIT_ERROR
    if args.json:
        print(json.dumps({"bundle": args.bundle, "ok": True, "hashes": not args.no_hash,
                          "artifacts": len(manifest.artifacts), "files": n,
                          **({"parity": parity} if parity is not None else {})}, indent=2))
        return EXIT_OK
    print(f"{args.bundle}: {len(manifest.artifacts)} artifacts, {n} files match the manifest")
    if parity is not None:
        from .convert.verify import format_parity

        print(f"parity.json (greedy / teacher-forced agreement with the reference, "
              f"{parity.get('n_tokens')} tokens per prompt, {len(parity.get('prompts', []))} "
              "prompts):")
        print(format_parity(parity))
    return EXIT_OK


def cmd_bundle_convert(args: argparse.Namespace) -> int:
    from .convert.pipeline import convert, parse_plan

    try:
        lengths = tuple(int(n) for n in args.prefill_lengths.split(","))
    except ValueError:
        print(f"error: --prefill-lengths takes N,N,... (got {args.prefill_lengths!r})",
              file=sys.stderr)
        return EXIT_USAGE
    plan = parse_plan(args.formats, args.precision or (), prefill_lengths=lengths,
                      cache_length=args.cache_length, verify=args.verify, name=args.name,
                      threads=args.threads, litert_tokenizer=args.litert_tokenizer)
    import signal

    def terminated(signum: int, _frame: object) -> None:
        # SIGTERM unwinds like Ctrl-C, so a running exporter subprocess is killed with us
        # (subprocess.run kills its child on any exception) instead of writing on, orphaned,
        # into a stage directory that the next run recreates
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        report = convert(args.src, args.out, plan, draft=args.draft, work_dir=args.work_dir,
                         tool_output=args.verbose > 0)
    finally:
        signal.signal(signal.SIGTERM, previous)
    for art in report["artifacts"]:
        print(f"{art['format']:7} {art['precision']:7} {art['bytes'] / 1e6:9.1f} MB "
              f"{art['seconds']:7.1f} s  {', '.join(art['paths'])}")
    print(f"wrote {args.out}/manifest.json and convert.json"
          + (", parity.json" if args.verify else ""), file=sys.stderr)
    return EXIT_OK


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help that shows each flag's default (unless it is None/False, or the text says it)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (default not in (None, False, argparse.SUPPRESS) and "default" not in text
                and action.option_strings and not isinstance(default, list)):
            text += " (default: %(default)s)"
        return text


#: Flags that set a StreamConfig field: flag -> (type, help). The help names StreamConfig's
#: default where the flag has none (tests check the two agree).
_STREAM_FLAGS: dict[str, tuple[Any, str]] = {
    "--max-tokens": (int, "tokens generated at most per reply"),
    "--context-size": (int, "KV context window in tokens (default: 2048)"),
    "--threads": (int, "compute threads (default: the backend's choice)"),
    "--batch-size": (int, "most tokens per prefill chunk (default: 512)"),
    "--temperature": (float, "sampling temperature; 0 decodes greedily (default: 0)"),
    "--top-k": (int, "sample among the k likeliest tokens; 0 disables (default: 0)"),
    "--top-p": (float, "nucleus sampling mass; 1 disables (default: 1)"),
    "--min-p": (float, "drop tokens below this probability relative to the top one; 0 "
                "disables (default: 0)"),
    "--repeat-penalty": (float, "penalty on recently generated tokens; 1 disables "
                         "(default: 1)"),
    "--seed": (int, "sampler seed, used when --temperature > 0 (default: 0)"),
    "--tokens-per-step": (int, "tokens one step produces (default: 1)"),
    "--draft-length": (int, "tokens drafted per speculative step (default: 4)"),
}


def _stream_flags(p: argparse.ArgumentParser, *flags: str, max_tokens: int | None = None,
                  backend: bool = True, options: bool = True) -> None:
    """Add the StreamConfig flags named in ``flags`` (see :data:`_STREAM_FLAGS`)."""
    if backend:
        p.add_argument("--backend", metavar="NAME",
                       help="hard-select a backend (like ELIZA_LLM_BACKEND; default: chosen "
                       "from the host and the bundle)")
    for flag in flags:
        kind, text = _STREAM_FLAGS[flag]
        default = max_tokens if flag == "--max-tokens" else None
        p.add_argument(flag, type=kind, default=default, help=text,
                       metavar="N" if kind is int else "X")
    if "--max-tokens" in flags:
        p.add_argument("--ignore-eos", action="store_true", default=None,
                       help="keep generating past end-of-generation tokens")
    if "--draft-length" in flags:
        p.add_argument("--drafter", choices=["none", "ngram", "model", "mtp"],
                       help="speculative decoding drafter (default: none)")
    if options:
        p.add_argument("--option", action="append", metavar="BACKEND:KEY=VALUE",
                       help="a backend option (repeatable), value parsed as JSON when it can "
                       "be")


def _json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")


_BUNDLE_HELP = "a bundle folder, or one model file / MLX folder (an implicit bundle)"


class _VersionAction(argparse.Action):
    """``--version``: the core's version, each installed backend plugin's, and Python's."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: Any = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        import platform

        from . import __version__
        from .registry import list_backends

        lines = [f"eliza-backends {__version__} (Python {platform.python_version()}, "
                 f"{sys.platform} {platform.machine()})"]
        lines += [f"  {i.name}: {i.distribution or '-'} {i.version or ''}".rstrip()
                  for i in list_backends()]
        print("\n".join(lines))
        parser.exit()


def _verbosity_flags(p: argparse.ArgumentParser, *, default: tuple[int, bool] | None) -> None:
    """``-v``/``-q``; ``default=None`` for a subcommand (it keeps the top level's values)."""
    loud = p.add_mutually_exclusive_group()
    loud.add_argument("-v", "--verbose", action="count",
                      default=argparse.SUPPRESS if default is None else default[0],
                      help="more log output on stderr: -v info, -vv debug (the runtimes' "
                      "native logs included)")
    loud.add_argument("-q", "--quiet", action="store_true",
                      default=argparse.SUPPRESS if default is None else default[1],
                      help="errors only: no stats lines, no warnings")


#: A command-table step: an argument (its names and add_argument keywords) or a function that
#: adds shared flags to the command's parser.
_Step = tuple[tuple[str, ...], dict[str, Any]] | Callable[[argparse.ArgumentParser], None]


def _arg(*names: str, **options: Any) -> _Step:
    """One ``add_argument(*names, **options)`` step of a command table."""
    return names, options


_BUNDLE_ARG = _arg("bundle", metavar="BUNDLE", help=_BUNDLE_HELP)

#: The commands: (name, help and description, steps in help order, ``set_defaults`` keywords).
_COMMANDS: tuple[tuple[str, str, tuple[_Step, ...], dict[str, Any]], ...] = (
    ("list", "installed backends, availability and rank", (_json_flag,), dict(func=cmd_list)),
    ("select", "which backend would serve a bundle", (
        _BUNDLE_ARG,
        _arg("--backend", metavar="NAME", help="hard-select a backend (like ELIZA_LLM_BACKEND)"),
        _arg("--explain", action="store_true", help="every candidate's verdict"),
        _json_flag), dict(func=cmd_select)),
    ("generate", "stream a completion (or, with --chat, a chat reply) to stdout", (
        _BUNDLE_ARG,
        _arg("prompt", metavar="PROMPT", help="the prompt text"),
        _arg("--chat", action="store_true",
             help="send PROMPT as a user message through the model's chat template"),
        _arg("--system", metavar="TEXT", help="a system message (with --chat)"),
        lambda p: _stream_flags(p, *_STREAM_FLAGS, max_tokens=128),
        _arg("--stop", action="append", metavar="TEXT",
             help="stop string (repeatable); generation ends before it"),
        _json_flag), dict(func=cmd_generate)),
    ("chat", "a conversation in the terminal, with the model's chat template", (
        _BUNDLE_ARG,
        _arg("--system", metavar="TEXT", help="a system message"),
        lambda p: _stream_flags(p, "--max-tokens", "--context-size", "--threads",
                                "--temperature", "--top-k", "--top-p", "--min-p",
                                "--repeat-penalty", "--seed", max_tokens=256)),
     dict(func=cmd_chat, stop=None)),
    ("bench", "measure backends on a bundle, each run in a fresh process", (
        _BUNDLE_ARG,
        _arg("--backend", action="append", metavar="NAME",
             help="backend to measure (repeatable; default: every available backend "
             "that can serve the bundle)"),
        _arg("--prompt-tokens", type=int_in(1), default=128, help="prompt length in tokens"),
        _arg("--gen-tokens", type=int_in(1), default=128, help="tokens generated per run"),
        _arg("--repeat", type=int_in(1), default=3, help="runs per backend, interleaved"),
        lambda p: _stream_flags(p, "--threads", "--context-size", "--draft-length",
                                "--tokens-per-step", backend=False, options=False),
        _json_flag), dict(func=cmd_bench)),
    ("serve", "an OpenAI-compatible HTTP server (needs the server extra)", (
        _BUNDLE_ARG,
        _arg("--host", default="127.0.0.1", help="address to listen on"),
        _arg("--port", type=int_in(0, 65535), default=8000, help="TCP port (0: any free one)"),
        _arg("--parallel", type=int_in(1, 1024), metavar="N",
             help="concurrent generations batched in one runtime context (continuous "
             "batching; they share every core); a backend that does not batch runs N "
             "independent sessions and says so (default: 8 on a batching backend, else 1)"),
        _arg("--sessions", type=int_in(1, 1024), metavar="N",
             help="concurrent generations as N independent sessions, the cores split among "
             "them (instead of --parallel)"),
        _arg("--queue", type=int_in(0), help="requests that may wait for a session before "
             "the server answers 429 (default: 4 per session)"),
        _arg("--model-name", help="the model id clients send (default: the bundle's name)"),
        lambda p: _stream_flags(p, "--context-size", "--batch-size"),
        _arg("--threads", type=int_in(1, 1024), help="compute threads: of the batched "
             "context with --parallel (default: every core), per session with --sessions "
             "(default: the cores divided among the sessions)"),
        _arg("--temperature", type=float_in(0.0), help="default when a request has none "
             "(default: 0)"),
        _arg("--seed", type=int, help="default when a request has none (default: 0)"),
        _arg("--grace", type=float_in(0.0, 86400.0), default=10.0,
             help="seconds running requests get to finish after Ctrl-C; then their "
             "connections are closed"),
        _arg("--log-format", choices=["text", "json"], default="text",
             help="access and server log format"),
        _arg("--log-level", default="info", choices=LOG_LEVELS, type=str.lower,
             help="server log level")), dict(func=cmd_serve, stop=None)),
)

#: The ``bundle`` subcommands, as :data:`_COMMANDS`.
_BUNDLE_COMMANDS: tuple[tuple[str, str, tuple[_Step, ...], dict[str, Any]], ...] = (
    ("create", "lay out text/ and write manifest.json", (
        _arg("out", metavar="OUT", help="the bundle folder to create (may exist)"),
        _arg("artifacts", nargs="+", metavar="ARTIFACT", help="model files or folders for text/"),
        _arg("--draft", action="append", metavar="ARTIFACT",
             help="draft model for text/draft/ (repeatable)"),
        _arg("--name", help="the bundle's name in the manifest (default: OUT's name)"),
        _arg("--link", action="store_true",
             help="hard-link the files instead of copying them (same filesystem only)"),
        _json_flag), dict(func=cmd_bundle_create)),
    ("verify", "check the files against manifest.json", (
        _arg("bundle", metavar="BUNDLE", help="the bundle folder"),
        _arg("--no-hash", action="store_true", help="check sizes only"),
        _json_flag), dict(func=cmd_bundle_verify)),
)

#: ``bundle convert``: a plain subparser (no description, no verbosity flags of its own).
_CONVERT_HELP = ("convert a GGUF or a Hugging Face checkpoint folder into a bundle in every "
                 "format (needs the converter tools: pip install 'eliza-backends[convert]')")
_CONVERT_STEPS: tuple[_Step, ...] = (
    _arg("src", help="a .gguf file or a Hugging Face checkpoint folder (config.json, "
         "safetensors, tokenizer files)"),
    _arg("out", help="the bundle directory to write"),
    _arg("--formats", help="comma-separated: gguf, mlx, litert, coreml (default: "
         "every format whose tools are installed)"),
    _arg("--precision", action="append", metavar="FORMAT=P[,P]",
         help="precisions per format (repeatable): gguf f32/f16/bf16/q8_0/q4_0/q4_k, "
         "mlx f32/f16/bf16/q8/q4, litert fp32/int8, coreml fp32/fp16; default f32/fp32"),
    _arg("--prefill-lengths", default="128", help="LiteRT prefill signatures"),
    _arg("--cache-length", type=int_in(1), default=1024, help="LiteRT KV cache length"),
    _arg("--litert-tokenizer", choices=["auto", "hf", "sp"], default="auto",
         help="the .litertlm tokenizer section (auto: SentencePiece for "
         "SentencePiece vocabularies, else tokenizer.json)"),
    _arg("--draft", metavar="DIR", help="a Gemma 4 target's MTP assistant "
         "(gemma4_assistant Hugging Face folder): converted to text/draft/mtp/ (f32 GGUF)"),
    _arg("--verify", action="store_true", help="score every artifact against a "
         "transformers float32 reference; writes parity.json"),
    _arg("--name", help="bundle and file name stem (default: from the source)"),
    _arg("--threads", type=int_in(1, 1024), help="compute threads for quantizing and "
         "verifying (default: the backends' choice)"),
    _arg("--work-dir", help="where cached stages live (default: "
         "$ELIZA_CACHE_DIR/convert or ~/.cache/eliza-backends/convert)"),
)


def _add_steps(p: argparse.ArgumentParser, steps: Sequence[_Step],
               defaults: dict[str, Any]) -> None:
    """Add a command table's ``steps`` to ``p`` in order, then its ``defaults``."""
    for step in steps:
        if callable(step):
            step(p)
        else:
            names, options = step
            p.add_argument(*names, **options)
    p.set_defaults(**defaults)


def _add_commands(sub: Any, table: Sequence[tuple[str, str, tuple[_Step, ...],
                                                  dict[str, Any]]]) -> None:
    """One subparser per ``table`` row under ``sub``, each taking -v/-q after its name too."""
    for name, text, steps, defaults in table:
        p: argparse.ArgumentParser = sub.add_parser(
            name, help=text, description=text, formatter_class=_HelpFormatter)
        _verbosity_flags(p, default=None)  # also accepted after the command name
        _add_steps(p, steps, defaults)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for documentation and tests), built from the command
    tables :data:`_COMMANDS`, :data:`_BUNDLE_COMMANDS` and :data:`_CONVERT_STEPS`."""
    parser = Parser(
        prog="eliza-backends", formatter_class=_HelpFormatter,
        description="Select-and-stream LLM inference over llama.cpp, LiteRT and MLX backends.",
        epilog="BUNDLE is a bundle folder or a single model artifact. Generated text goes to "
        "stdout; stats, notices and logs to stderr.")
    parser.add_argument("--version", action=_VersionAction,
                        help="print the versions of the core and each backend, then exit")
    _verbosity_flags(parser, default=(0, False))
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_commands(sub, _COMMANDS)
    text = "create or verify a model bundle"
    b = sub.add_parser("bundle", help=text, description=text, formatter_class=_HelpFormatter)
    _verbosity_flags(b, default=None)
    bsub = b.add_subparsers(dest="bundle_command", required=True, metavar="SUBCOMMAND")
    _add_commands(bsub, _BUNDLE_COMMANDS)
    _add_steps(bsub.add_parser("convert", help=_CONVERT_HELP), _CONVERT_STEPS,
               dict(func=cmd_bundle_convert))
    return parser


#: Loggers of the runtimes' native output (routed into logging by the plugins).
NATIVE_LOGGERS = ("eliza_llamacpp.native", "eliza_litert.native", "eliza_mlx.native")


def configure_logging(verbose: int, quiet: bool) -> None:
    """``-v``/``-q``: one stderr handler for every logger, the runtimes' native ones
    included: default warnings (native: errors), ``-v`` info, ``-vv`` debug, ``-q`` errors."""
    import logging

    if quiet:
        level = logging.ERROR
    else:
        level = {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)
    logging.basicConfig(level=level, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    native = logging.ERROR if verbose == 0 or quiet else level
    for name in NATIVE_LOGGERS:
        logging.getLogger(name).setLevel(native)


def _print_json_error(exc: ElizaError) -> None:
    print(json.dumps({"error": {"code": exc.code.symbol, "message": exc.message}}, indent=2))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``eliza-backends`` command."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        check_args(args, _config_from_args)
    except InvalidArgumentError as exc:  # bad usage: one line, before any model loads
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    configure_logging(args.verbose, args.quiet)
    try:
        code: int = args.func(args)
        return code
    except ElizaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if getattr(args, "json", False):
            _print_json_error(exc)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
