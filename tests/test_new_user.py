"""What a new user meets first (issue 21), driven through the real CLI and API on the tiny
bundle: a model file as an implicit bundle, ``bundle create --link``, ``generate --chat``, the
cut notice, ``--version``, ``-v``/``-q``, help defaults, ``list`` in 80 columns, ``--json``,
the chat REPL, stream slots, the async API, LiteRT's native log lines."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from conftest import TINY_BUNDLE

from eliza_backends import (
    BundleError,
    InferenceContext,
    SlotError,
    StreamConfig,
    StreamOverrides,
    aopen_stream,
    explain,
    open_stream,
)
from eliza_backends.backend.native_output import replay
from eliza_backends.cli import _STREAM_FLAGS, build_parser

GGUF = TINY_BUNDLE / "text" / "tiny-f16.gguf"
MLX_DIR = TINY_BUNDLE / "text" / "tiny-mlx"
PROMPT = "Four score and seven years ago"


def _cli(*args: str, stdin: str | None = None,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k != "ELIZA_LLM_BACKEND"}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "eliza_backends", *args], env=full_env,
                          input=stdin, capture_output=True, text=True, timeout=300)


# ------------------------------------------------------------------ implicit bundles, --link


def test_a_gguf_file_is_an_implicit_bundle_for_the_api_and_the_cli() -> None:
    with open_stream(GGUF, max_tokens=8, threads=1) as stream:
        stream.prefill(PROMPT)
        from_file = stream.text()
        staged = stream.context.bundle_dir
        assert stream.backend == "llama.cpp" and (staged / "text" / GGUF.name).is_symlink()
    assert not staged.exists(), "closing the context removes the staging links"
    assert GGUF.is_file(), "and never the model"
    with open_stream(TINY_BUNDLE, backend="llama.cpp", max_tokens=8, threads=1) as stream:
        stream.prefill(PROMPT)
        assert stream.text() == from_file
    report = explain(GGUF)
    assert report.chosen == "llama.cpp" and report.bundle_dir == str(GGUF)
    out = _cli("generate", str(GGUF), PROMPT, "--max-tokens", "8", "--threads", "1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == from_file.strip()
    assert _cli("select", str(GGUF)).stdout.strip() == "llama.cpp"


def test_an_mlx_folder_is_an_implicit_bundle() -> None:
    report = explain(MLX_DIR)
    assert report.chosen == "mlx-coreml", report
    with InferenceContext(MLX_DIR) as ctx:
        assert ctx.source == MLX_DIR and ctx.bundle_dir.name == "tiny-mlx"


def test_what_is_neither_a_bundle_nor_an_artifact_says_what_to_pass(tmp_path: Path) -> None:
    stray = tmp_path / "notes.txt"
    stray.write_text("hello")
    with pytest.raises(BundleError, match="neither a bundle folder") as err:
        open_stream(stray)
    assert "bundle create" in err.value.message
    with pytest.raises(BundleError, match="does not exist"):
        open_stream(tmp_path / "missing.gguf")
    out = _cli("generate", str(stray), "hi", "--json")
    assert out.returncode == 1
    assert json.loads(out.stdout)["error"]["code"] == "ELIZA_ERR_BUNDLE"
    assert "neither a bundle folder" in out.stderr


def test_bundle_create_link_hard_links_instead_of_copying(tmp_path: Path) -> None:
    out = _cli("bundle", "create", str(tmp_path / "b"), str(GGUF), str(MLX_DIR), "--link",
               "--json")
    assert out.returncode == 0, out.stderr
    manifest = json.loads(out.stdout)
    assert {a["format"] for a in manifest["artifacts"]} == {"gguf", "mlx"}
    linked = tmp_path / "b" / "text" / GGUF.name
    assert linked.stat().st_ino == GGUF.stat().st_ino and not linked.is_symlink()
    weights = tmp_path / "b" / "text" / "tiny-mlx" / "model.safetensors"
    assert weights.stat().st_ino == (MLX_DIR / "model.safetensors").stat().st_ino
    verify = _cli("bundle", "verify", str(tmp_path / "b"), "--json")
    assert verify.returncode == 0, verify.stderr
    assert json.loads(verify.stdout) == {"bundle": str(tmp_path / "b"), "ok": True,
                                         "hashes": True, "artifacts": 2, "files": 8}


# ------------------------------------------------------------------ generate, conventions


def test_generate_chat_uses_the_template_and_says_when_the_reply_was_cut() -> None:
    out = _cli("generate", str(TINY_BUNDLE), "What is two plus two?", "--chat",
               "--max-tokens", "32", "--threads", "1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "Two plus two is four."
    assert "finish: eos" in out.stderr and "reply cut" not in out.stderr
    cut = _cli("generate", str(TINY_BUNDLE), PROMPT, "--max-tokens", "4", "--threads", "1")
    assert cut.returncode == 0, cut.stderr
    assert "[reply cut at 4 tokens (--max-tokens); raise it for more]" in cut.stderr
    quiet = _cli("-q", "generate", str(TINY_BUNDLE), PROMPT, "--max-tokens", "4",
                 "--threads", "1")
    assert quiet.stdout == cut.stdout and quiet.stderr == ""
    data = json.loads(_cli("generate", str(TINY_BUNDLE), PROMPT, "--max-tokens", "4",
                           "--threads", "1", "--json").stdout)
    assert data["text"] == cut.stdout.rstrip("\n") and data["finish_reason"] == "length"
    assert data["metrics"]["decode_tokens"] == 4 and data["backend"] == "llama.cpp"


def test_version_names_the_core_and_every_backend() -> None:
    out = _cli("--version")
    assert out.returncode == 0, out.stderr
    first, *backends = out.stdout.splitlines()
    import eliza_backends

    assert first.startswith(f"eliza-backends {eliza_backends.__version__} (Python ")
    assert any(line.strip().startswith("llama.cpp: eliza-llamacpp ") for line in backends)


def test_verbose_shows_the_runtimes_native_logs_and_the_default_does_not() -> None:
    args = ("generate", str(TINY_BUNDLE), PROMPT, "--max-tokens", "2", "--threads", "1")
    quiet = _cli(*args)
    loud = _cli("-vv", *args)
    assert quiet.returncode == loud.returncode == 0, loud.stderr
    assert "eliza_llamacpp.native" not in quiet.stderr
    assert "DEBUG eliza_llamacpp.native:" in loud.stderr or \
        "INFO eliza_llamacpp.native:" in loud.stderr
    assert loud.stdout == quiet.stdout
    after = _cli("generate", "-v", *args[1:])  # also after the command name
    assert after.returncode == 0 and "INFO eliza_llamacpp.native:" in after.stderr


def test_every_flag_has_help_and_the_defaults_it_states_are_streamconfigs() -> None:
    parser = build_parser()
    subs = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    fields = StreamConfig.model_fields
    for name, sub in {**subs, **subs["bundle"]._subparsers._group_actions[0].choices}.items():
        for action in sub._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            assert action.help, f"{name} {action.option_strings or action.dest} has no help"
    for flag, (_, text) in _STREAM_FLAGS.items():
        key = flag.removeprefix("--").replace("-", "_")
        default = fields[key].default
        if "(default: " in text and default is not None:
            stated = text.rsplit("(default: ", 1)[1].rstrip(")")
            assert float(stated) == float(default), (flag, stated, default)
    help_text = _cli("generate", "--help").stdout
    assert "(default: 128)" in help_text and "(default: 2048)" in help_text


def test_list_fits_80_columns_and_json_is_everywhere() -> None:
    out = _cli("list", env={"COLUMNS": "80"})
    assert out.returncode == 0, out.stderr
    assert max(len(line) for line in out.stdout.splitlines()) <= 80, out.stdout
    assert "llama.cpp" in out.stdout and "aliases: llamacpp" in out.stdout
    parser = build_parser()
    subs = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    printing = ["list", "select", "generate", "bench"]
    for name in printing:
        assert "--json" in subs[name]._option_string_actions, name
    for name in ("create", "verify"):
        bundle = subs["bundle"]._subparsers._group_actions[0].choices
        assert "--json" in bundle[name]._option_string_actions, name


# ------------------------------------------------------------------ the chat REPL


def test_chat_repl_multiline_save_and_load(tmp_path: Path) -> None:
    slot = tmp_path / "talk.slot"
    first = _cli("chat", str(TINY_BUNDLE), "--threads", "1", "--max-tokens", "32",
                 stdin=f'What is two plus two?\n/save {slot}\n/quit\n')
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == "Two plus two is four."
    assert "[saved 2 messages" in first.stderr and slot.is_file()
    saved = json.loads((tmp_path / "talk.slot.messages.json").read_text())
    assert saved[-1] == {"role": "assistant", "content": "Two plus two is four."}
    second = _cli("chat", str(TINY_BUNDLE), "--threads", "1", "--max-tokens", "32",
                  stdin=f'/load {slot}\n"""\nWhat is two\nplus two?\n"""\n')
    assert second.returncode == 0, second.stderr
    assert "[loaded 2 messages" in second.stderr
    # the loaded conversation's tokens were reused: only the new turn was prefilled
    new = int(second.stderr.split("[prefilled ")[1].split()[0])
    assert 0 < new < 30
    bad = _cli("chat", str(TINY_BUNDLE), "--threads", "1",
               stdin=f"/load {tmp_path / 'nothing'}\n/bogus\n")
    assert bad.returncode == 0 and "[/load failed:" in bad.stderr
    assert "[unknown command /bogus" in bad.stderr


def test_chat_ctrl_c_stops_the_reply_and_keeps_the_conversation(tmp_path: Path) -> None:
    """SIGINT mid-reply stops the reply, and the REPL keeps the conversation and goes on
    reading; end of input (Ctrl-D) then leaves with status 0."""
    env = {k: v for k, v in os.environ.items() if k != "ELIZA_LLM_BACKEND"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "eliza_backends", "chat", str(TINY_BUNDLE), "--threads", "1",
         "--ignore-eos", "--max-tokens", "100000", "--context-size", "16384"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env)
    assert proc.stdin is not None and proc.stdout is not None
    slot = tmp_path / "cut.slot"
    try:
        proc.stdin.write(f"{PROMPT}\n")
        proc.stdin.flush()
        head = proc.stdout.read(8)  # the reply is streaming
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(f"/save {slot}\n", timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "[reply stopped; the conversation keeps what was said]" in err
    saved = json.loads((tmp_path / "cut.slot.messages.json").read_text())
    assert saved[0]["content"] == PROMPT and saved[1]["role"] == "assistant"
    assert saved[1]["content"].startswith(head), (head, saved)


# ------------------------------------------------------------------ API gaps


def test_stream_save_and_restore_slot(tmp_path: Path) -> None:
    slot = tmp_path / "s.slot"
    with open_stream(TINY_BUNDLE, backend="llama.cpp", max_tokens=6, threads=1) as a:
        a.prefill(PROMPT)
        a.save_slot(slot)
        expected = a.text()
    with open_stream(GGUF, max_tokens=6, threads=1) as b:  # same model, via the file
        b.restore_slot(slot)
        assert b.session.n_past == len(b.session.history) > 0
        assert b.text() == expected
    slot.write_bytes(slot.read_bytes()[:-5])
    with open_stream(TINY_BUNDLE, backend="llama.cpp", max_tokens=6, threads=1) as c, \
            pytest.raises(SlotError):
        c.restore_slot(slot)


def test_async_open_and_prefill_keep_the_event_loop_running() -> None:
    async def main() -> tuple[str, int]:
        ticks = 0
        done = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(ticker())
        stream = await aopen_stream(TINY_BUNDLE, backend="llama.cpp", max_tokens=8, threads=1)
        with stream:
            await stream.aprefill(PROMPT)
            text = "".join([step.text async for step in stream])
        done.set()
        await task
        return text, ticks

    text, ticks = asyncio.run(main())
    assert text.startswith(" our fathers")
    assert ticks > 10, "the loop ran while the model loaded and prefilled"


def test_open_stream_overrides_are_typed_as_the_config_fields() -> None:
    hints = typing.get_type_hints(StreamOverrides)
    assert set(hints) == set(StreamConfig.model_fields), "StreamOverrides drifted"
    assert open_stream.__annotations__["overrides"] == "Unpack[StreamOverrides]"


# ------------------------------------------------------------------ LiteRT's native logs


def test_litert_opens_quietly_by_default() -> None:
    out = _cli("generate", str(TINY_BUNDLE), PROMPT, "--backend", "litert", "--max-tokens", "4",
               "--threads", "1")
    assert out.returncode == 0, out.stderr
    load_lines = [line for line in out.stderr.splitlines()
                  if "environment.cc" in line or "compiler_plugin" in line
                  or "RegisterAccelerator" in line]
    assert load_lines == [], out.stderr
    loud = _cli("-v", "generate", str(TINY_BUNDLE), PROMPT, "--backend", "litert",
                "--max-tokens", "4", "--threads", "1")
    assert "INFO eliza_litert.native: INFO: [environment.cc" in loud.stderr
    assert loud.stdout == out.stdout


def test_replay_routes_prefixed_lines_and_passes_others_through(
        caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> None:
    log = logging.getLogger("test.native")
    with caplog.at_level(logging.DEBUG, logger="test.native"):
        replay("not ours\nINFO: [a.cc:1] hello\nWARNING: [b.cc:2] failed: x\n└ because y\n"
               "E1201 12:00:00 c.cc:3] boom\n", log)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, "INFO: [a.cc:1] hello"),
        (logging.WARNING, "WARNING: [b.cc:2] failed: x"),
        (logging.WARNING, "└ because y"),
        (logging.ERROR, "E1201 12:00:00 c.cc:3] boom")]
    assert capfd.readouterr().err == "not ours\n"


# ------------------------------------------------------------------ bench progress


def test_bench_progress_moves_within_a_run() -> None:
    out = _cli("bench", str(TINY_BUNDLE), "--backend", "llama.cpp", "--repeat", "1",
               "--prompt-tokens", "16", "--gen-tokens", "48", "--threads", "1")
    assert out.returncode == 0, out.stderr
    frames = out.stderr.replace("\r", "\n").splitlines()
    assert any("llama.cpp: load" in f for f in frames), frames
    assert any("llama.cpp: prefill 0/16" in f for f in frames), frames
    decoded = [f for f in frames if "llama.cpp: decode " in f]
    assert [f.split("decode ")[1].split()[0] for f in decoded] == ["16/48", "32/48", "48/48"]
    assert "\x1e" not in out.stderr, "the marks are read by the driver, not shown"
    assert "llama.cpp" in out.stdout and "decode tok/s" in out.stdout
