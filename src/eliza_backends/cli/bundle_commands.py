"""The ``bundle`` commands: ``create``, ``verify``, ``convert``.

Each handler takes the parsed arguments (checked by :func:`~eliza_backends.cli.args.check_args`:
paths, names, the conversion plan) and returns the exit code. Everything past argparse is
imported inside the handler, so ``--help`` loads nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .output import EXIT_ERROR, EXIT_OK


def cmd_bundle_create(args: argparse.Namespace) -> int:
    """``bundle create``: lay out ``text/`` and write ``manifest.json``."""
    from ..manifest import create_bundle

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
    """``bundle verify``: the files against ``manifest.json``; ``parity.json`` shown if any."""
    from ..manifest import verify_bundle

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
        from ..convert.verify import format_parity

        print(f"parity.json (greedy / teacher-forced agreement with the reference, "
              f"{parity.get('n_tokens')} tokens per prompt, {len(parity.get('prompts', []))} "
              "prompts):")
        print(format_parity(parity))
    return EXIT_OK


def cmd_bundle_convert(args: argparse.Namespace) -> int:
    """``bundle convert``: a GGUF or a Hugging Face checkpoint into a bundle in every format;
    SIGTERM unwinds like Ctrl-C (a running exporter subprocess dies with us)."""
    import signal

    from ..convert.pipeline import convert, parse_plan

    lengths = tuple(int(n) for n in args.prefill_lengths.split(","))  # checked by check_args
    plan = parse_plan(args.formats, args.precision or (), prefill_lengths=lengths,
                      cache_length=args.cache_length, verify=args.verify, name=args.name,
                      threads=args.threads, litert_tokenizer=args.litert_tokenizer)

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


__all__ = ["cmd_bundle_convert", "cmd_bundle_create", "cmd_bundle_verify"]
