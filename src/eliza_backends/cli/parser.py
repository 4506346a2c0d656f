"""The ``eliza-backends`` argument parser, built from tables.

:data:`_COMMANDS` (one row per command: its name, help, argument steps and the handler it
runs), :data:`_BUNDLE_COMMANDS` (``bundle create`` / ``verify``) and :data:`_CONVERT_STEPS`
(``bundle convert``) are walked by :func:`build_parser`; the StreamConfig flags are one table,
:data:`_STREAM_FLAGS`, that each command picks from. Errors are
:class:`~eliza_backends.errors.InvalidArgumentError` (:class:`~eliza_backends.cli.args.Parser`),
printed as one line with exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from .args import LOG_LEVELS, Parser, float_in, int_in
from .bundle_commands import cmd_bundle_convert, cmd_bundle_create, cmd_bundle_verify
from .chat import cmd_chat
from .commands import cmd_bench, cmd_generate, cmd_list, cmd_select, cmd_serve


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

        from .. import __version__
        from ..registry import list_backends

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
        _arg("--image", action="append", metavar="PATH",
             help="an image (PNG, JPEG, WebP) in the user message, before PROMPT (repeatable; "
             "implies --chat)"),
        _arg("--audio", action="append", metavar="PATH",
             help="an audio clip (WAV, MP3, FLAC) in the user message, after the images "
             "(repeatable; implies --chat)"),
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
        _arg("--media-rounds", type=int_in(0), default=5,
             help="media prefills per run and kind where the backend takes media, beside "
             "the runtime's own media path (llama.cpp: llama-cpp-python's libmtmd), "
             "interleaved (0: none)"),
        _arg("--image", metavar="PATH", help="the image to time (default: the "
             "bundle's media/ folder's first, else a generated 480x336 PNG)"),
        _arg("--audio", metavar="PATH", help="the audio clip to time (default: the "
             "bundle's media/ folder's first, else a generated 1 s WAV)"),
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
        _arg("--allow-media-files", action="store_true",
             help="let an image_url name a local file (a path or file://); off: data URIs "
             "only (remote URLs are never fetched)"),
        _arg("--api-key", metavar="KEY", help="every request but GET /health must send "
             "'Authorization: Bearer KEY' (or 'x-api-key: KEY'), else 401 (default: "
             "$ELIZA_API_KEY; none: no key needed, and a --host beyond loopback is warned "
             "about)"),
        _arg("--cache-ram", type=int_in(0), metavar="MiB", help="host memory for the prompt "
             "cache: a conversation evicted from its slot keeps its KV state there, and "
             "restores it when it comes back (0: off; default: an eighth of the RAM, at most "
             "8192)"),
        _arg("--slot-save-path", metavar="DIR", help="the folder of the slot files that "
             "POST /slots/{id}?action=save|restore writes and reads (default: none; erase "
             "works without)"),
        lambda p: _stream_flags(p, "--context-size", "--batch-size", "--draft-length"),
        _arg("--draft-policy", choices=["auto", "fixed"], help="auto: each round's draft "
             "length from the measured acceptance and cost, up to --draft-length; fixed: "
             "always --draft-length (default: auto)"),
        _arg("--threads", type=int_in(1, 1024), help="compute threads: of the batched "
             "context with --parallel (default: every core), per session with --sessions "
             "(default: the cores divided among the sessions)"),
        _arg("--temperature", type=float_in(0.0), help="default when a request has none "
             "(default: 0)"),
        _arg("--seed", type=int, help="default when a request has none (default: 0)"),
        _arg("--no-warmup", action="store_true", help="listen at once, without first "
             "decoding a few tokens to warm the runtime up (the first request then pays for "
             "it)"),
        _arg("--grace", type=float_in(0.0, 86400.0), default=10.0,
             help="seconds running requests get to finish after Ctrl-C; then their "
             "connections are closed"),
        _arg("--log-format", choices=["text", "json"], default="text",
             help="access and server log format"),
        _arg("--log-level", default="info", choices=LOG_LEVELS, type=str.lower,
             help="server log level")), dict(func=cmd_serve, stop=None)),
)


#: The ``bundle`` subcommands, as :data:`_COMMANDS`; ``loads_runtime=False``: the command
#: loads no backend, so its logging setup skips the plugins' native loggers.
_BUNDLE_COMMANDS: tuple[tuple[str, str, tuple[_Step, ...], dict[str, Any]], ...] = (
    ("create", "lay out text/ and write manifest.json", (
        _arg("out", metavar="OUT", help="the bundle folder to create (may exist)"),
        _arg("artifacts", nargs="+", metavar="ARTIFACT", help="model files or folders for text/"),
        _arg("--draft", action="append", metavar="ARTIFACT",
             help="draft model for text/draft/ (repeatable)"),
        _arg("--name", help="the bundle's name in the manifest (default: OUT's name)"),
        _arg("--link", action="store_true",
             help="hard-link the files instead of copying them (same filesystem only)"),
        _json_flag), dict(func=cmd_bundle_create, loads_runtime=False)),
    ("verify", "check the files against manifest.json", (
        _arg("bundle", metavar="BUNDLE", help="the bundle folder"),
        _arg("--no-hash", action="store_true", help="check sizes only"),
        _json_flag), dict(func=cmd_bundle_verify, loads_runtime=False)),
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


__all__ = ["build_parser"]
