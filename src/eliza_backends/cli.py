"""The ``eliza-backends`` command line.

    eliza-backends list [--json]
    eliza-backends select BUNDLE [--backend NAME] [--explain] [--json]
    eliza-backends generate BUNDLE PROMPT [--backend NAME] [--max-tokens N] [sampling flags]
    eliza-backends chat BUNDLE [--backend NAME] [--system TEXT]
    eliza-backends bench BUNDLE [--backend NAME]... [--prompt-tokens N] [--gen-tokens N]
                         [--repeat N] [--json]
    eliza-backends serve BUNDLE [--host 127.0.0.1] [--port 8000] [--backend NAME] [--sessions N]
    eliza-backends bundle create OUT ARTIFACT... [--draft ARTIFACT] [--name NAME]
    eliza-backends bundle verify BUNDLE [--no-hash]

Exit codes: 0 ok, 1 an ElizaError (printed as one line), 2 bad usage, 130 interrupted.
Generated text goes to stdout as it streams; stats and errors go to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from .errors import ElizaError

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def _print_table(rows: list[list[str]], headers: list[str]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=False)).rstrip())
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)).rstrip())


def cmd_list(args: argparse.Namespace) -> int:
    from .registry import list_backends, plugin_problems

    infos = list_backends()
    problems = plugin_problems()
    if args.json:
        print(json.dumps({"backends": [i.to_dict() for i in infos],
                          "broken_plugins": [p.__dict__ for p in problems]}, indent=2))
        return EXIT_OK
    rows = [[i.name, ", ".join(i.aliases) or "-",
             f"{i.distribution or '-'} {i.version or ''}".strip(),
             "yes" if i.available else "no", str(i.rank), ", ".join(i.formats),
             i.reason if not i.available else (i.rank_reason or "")]
            for i in infos]
    _print_table(rows, ["backend", "aliases", "distribution", "available", "rank", "serves",
                        "notes"])
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
            "draft_length"]
    cfg = {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}
    if args.stop:
        cfg["stop"] = tuple(args.stop)
    if args.option:
        options: dict[str, dict[str, Any]] = {}
        for item in args.option:
            name, _, rest = item.partition(":")
            key, eq, value = rest.partition("=")
            if not name or not key or not eq:
                raise SystemExit(f"--option takes BACKEND:KEY=VALUE, got {item!r}")
            try:
                parsed: Any = json.loads(value)
            except ValueError:
                parsed = value
            options.setdefault(name, {})[key] = parsed
        cfg["options"] = options
    return cfg


def cmd_generate(args: argparse.Namespace) -> int:
    from .stream import open_stream

    with open_stream(args.bundle, backend=args.backend, **_config_from_args(args)) as stream:
        stream.prefill(args.prompt)
        reason = None
        for step in stream:
            sys.stdout.write(step.text)
            sys.stdout.flush()
            reason = step.finish_reason
        sys.stdout.write("\n")
        m = stream.metrics
        rate = m.acceptance_rate
        spec = f", drafted {m.drafted}, accepted {m.accepted} ({rate:.0%})" if rate is not None \
            else ""
        ttft = f"{m.time_to_first_token * 1000:.1f} ms" if m.time_to_first_token else "-"
        print(f"[{stream.backend}] prompt {m.prefill_tokens} tok "
              f"({m.prefill_tokens_per_second:.1f} tok/s), generated {m.decode_tokens} tok "
              f"({m.decode_tokens_per_second:.1f} tok/s), first token {ttft}{spec}, "
              f"finish: {reason}", file=sys.stderr)
    return EXIT_OK


def cmd_chat(args: argparse.Namespace) -> int:
    from .stream import open_stream

    messages: list[dict[str, str]] = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    interactive = sys.stdin.isatty()
    with open_stream(args.bundle, backend=args.backend, **_config_from_args(args)) as stream:
        print(f"[{stream.backend}] chatting with {args.bundle}; /reset to start over, "
              "/quit or Ctrl-D to leave", file=sys.stderr)
        while True:
            if interactive:
                sys.stdout.write("> ")
                sys.stdout.flush()
            line = sys.stdin.readline()
            if not line:
                break
            line = line.rstrip("\n")
            if line.strip() == "/quit":
                break
            if line.strip() == "/reset":
                messages = messages[:1] if args.system else []
                stream.reset()
                print("[conversation reset]", file=sys.stderr)
                continue
            if not line.strip():
                continue
            messages.append({"role": "user", "content": line})
            new = stream.prefill_messages(messages)
            reply = []
            for step in stream:
                sys.stdout.write(step.text)
                sys.stdout.flush()
                reply.append(step.text)
            sys.stdout.write("\n")
            sys.stdout.flush()
            messages.append({"role": "assistant", "content": "".join(reply)})
            m = stream.metrics
            ttft = (m.time_to_first_token or 0) * 1000
            print(f"[prefilled {new} new tokens, first token {ttft:.1f} ms]", file=sys.stderr)
    return EXIT_OK


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
                     sessions=args.sessions, queue=args.queue, config=config,
                     model=args.model_name, grace=args.grace, log_format=args.log_format,
                     log_level=args.log_level)
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR


def cmd_bundle_create(args: argparse.Namespace) -> int:
    from .bundle import create_bundle

    manifest = create_bundle(args.out, args.artifacts, drafts=args.draft or (), name=args.name)
    for art in manifest.artifacts:
        print(f"{art.path}  {art.format}  {art.backend or '-'}  {art.role}  {art.size} bytes")
    print(f"wrote {args.out}/manifest.json", file=sys.stderr)
    return EXIT_OK


def cmd_bundle_verify(args: argparse.Namespace) -> int:
    from .bundle import verify_bundle

    manifest = verify_bundle(args.bundle, hashes=not args.no_hash)
    n = sum(len(a.files) for a in manifest.artifacts)
    print(f"{args.bundle}: {len(manifest.artifacts)} artifacts, {n} files match the manifest")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for documentation and tests)."""
    parser = argparse.ArgumentParser(
        prog="eliza-backends",
        description="Select-and-stream LLM inference over llama.cpp, LiteRT and MLX backends.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("list", help="installed backends, availability and rank")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("select", help="which backend would serve a bundle")
    p.add_argument("bundle")
    p.add_argument("--backend", help="hard-select a backend (like ELIZA_LLM_BACKEND)")
    p.add_argument("--explain", action="store_true", help="every candidate's verdict")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_select)

    p = sub.add_parser("generate", help="stream a completion to stdout")
    p.add_argument("bundle")
    p.add_argument("prompt")
    p.add_argument("--backend")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--context-size", type=int)
    p.add_argument("--threads", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--temperature", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--top-p", type=float)
    p.add_argument("--min-p", type=float)
    p.add_argument("--repeat-penalty", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument("--tokens-per-step", type=int)
    p.add_argument("--drafter", choices=["none", "ngram", "model"])
    p.add_argument("--draft-length", type=int)
    p.add_argument("--stop", action="append", help="stop string (repeatable)")
    p.add_argument("--option", action="append", metavar="BACKEND:KEY=VALUE",
                   help="a backend option (repeatable), value parsed as JSON when it can be")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("chat", help="a conversation in the terminal, with the model's template")
    p.add_argument("bundle")
    p.add_argument("--backend")
    p.add_argument("--system", help="a system message")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--context-size", type=int)
    p.add_argument("--threads", type=int)
    p.add_argument("--temperature", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument("--option", action="append", metavar="BACKEND:KEY=VALUE")
    p.set_defaults(func=cmd_chat, stop=None)

    p = sub.add_parser("bench", help="measure backends on a bundle, each run in a fresh process")
    p.add_argument("bundle")
    p.add_argument("--backend", action="append", help="backend to measure (repeatable; "
                   "default: every available backend that can serve the bundle)")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--gen-tokens", type=int, default=128)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int)
    p.add_argument("--context-size", type=int)
    p.add_argument("--drafter", choices=["none", "ngram", "model"])
    p.add_argument("--draft-length", type=int)
    p.add_argument("--tokens-per-step", type=int)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (needs the server extra)")
    p.add_argument("bundle")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8000, help="TCP port (0: any free one)")
    p.add_argument("--backend", help="hard-select a backend (like ELIZA_LLM_BACKEND)")
    p.add_argument("--sessions", type=int, default=1,
                   help="concurrent generations over one model load")
    p.add_argument("--queue", type=int, help="requests that may wait for a session before "
                   "the server answers 429 (default: 4 per session)")
    p.add_argument("--model-name", help="the model id clients send (default: the bundle's "
                   "name)")
    p.add_argument("--context-size", type=int)
    p.add_argument("--threads", type=int, help="compute threads per session (default: the "
                   "cores divided among the sessions)")
    p.add_argument("--batch-size", type=int)
    p.add_argument("--temperature", type=float, help="default when a request has none")
    p.add_argument("--seed", type=int, help="default when a request has none")
    p.add_argument("--option", action="append", metavar="BACKEND:KEY=VALUE")
    p.add_argument("--grace", type=float, default=10.0, help="seconds running requests get "
                   "to finish after Ctrl-C")
    p.add_argument("--log-format", choices=["text", "json"], default="text")
    p.add_argument("--log-level", default="info")
    p.set_defaults(func=cmd_serve, stop=None)

    b = sub.add_parser("bundle", help="create or verify a model bundle")
    bsub = b.add_subparsers(dest="bundle_command", required=True)
    p = bsub.add_parser("create", help="lay out text/ and write manifest.json")
    p.add_argument("out")
    p.add_argument("artifacts", nargs="+", help="model files or folders for text/")
    p.add_argument("--draft", action="append", help="draft model for text/draft/ (repeatable)")
    p.add_argument("--name")
    p.set_defaults(func=cmd_bundle_create)
    p = bsub.add_parser("verify", help="check the files against manifest.json")
    p.add_argument("bundle")
    p.add_argument("--no-hash", action="store_true", help="check sizes only")
    p.set_defaults(func=cmd_bundle_verify)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``eliza-backends`` command."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
        return code
    except ElizaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
