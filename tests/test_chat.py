"""Chat: sandboxed templates, multi-turn prefix reuse, the CLI in a real pty."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TINY_BUNDLE, make_bundle
from scripted_backend import ScriptedFactory

from eliza_backends import (
    InvalidArgumentError,
    Registry,
    TemplateError,
    UnsupportedOperationError,
    generate_chat,
    hookimpl,
    open_stream,
    render_chat,
)

ORACLE = json.loads((TINY_BUNDLE / "oracle.json").read_text())
TEMPLATE = ORACLE["tokenizer"]["chat_template"]
MSGS = [{"role": "user", "content": "hi"}]

HOSTILE = {
    "dunder": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "globals": "{{ raise_exception.__globals__ }}",
    "cycler": "{{ cycler.__init__.__globals__.os }}",
    "include": "{% include '/etc/passwd' %}",
    "import": "{% import 'os' as os %}{{ os }}",
    "mutate": "{{ messages.append({'role': 'user'}) }}",
    "pow_bomb": "{{ 10 ** 100000 }}",
    "mul_bomb": "{{ 'a' * 1000000000 }}",
    "range_bomb": "{% for i in range(1000000000) %}x{% endfor %}",
    "raise": "{{ raise_exception('nope') }}",
    "syntax": "{% for %}",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_templates_are_stopped(name: str) -> None:
    """Either the sandbox refuses (TemplateError) or the forbidden value renders as nothing:
    internals never reach the output."""
    try:
        out = render_chat(HOSTILE[name], MSGS)
    except TemplateError:
        return
    assert name in ("globals", "cycler")  # unsafe attributes render as undefined
    assert out.strip() == ""


def test_sandbox_allows_ordinary_templates() -> None:
    out = render_chat(TEMPLATE, [{"role": "system", "content": "be brief"}, *MSGS],
                      bos_token="<|bos|>")
    assert out == "<|bos|><|system|>be brief<|end|><|user|>hi<|end|><|assistant|>"
    assert render_chat(TEMPLATE, MSGS, add_generation_prompt=False).endswith("<|end|>")


@pytest.mark.parametrize("bad", [[], "hi", [{"role": "robot", "content": "x"}],
                                 [{"role": "user", "content": 3}], [1]])
def test_bad_messages(bad: object) -> None:
    with pytest.raises(InvalidArgumentError):
        render_chat(TEMPLATE, bad)  # type: ignore[arg-type]


def test_rendered_ids_match_the_oracle_chat_prompts() -> None:
    """The oracle's messages, rendered with the model's own template (from the GGUF) and
    prefilled as chat, give the oracle's text and ids (the reference renders with HF
    transformers)."""
    chats = [c for c in ORACLE["prompts"] if c["kind"] == "chat"]
    assert chats
    with open_stream(TINY_BUNDLE, backend="llama.cpp", threads=1) as stream:
        template = stream.session.chat_template
        assert template is not None
        for case in chats:
            rendered = render_chat(template, case["messages"],
                                   **stream.session.template_tokens)
            assert rendered == case["rendered"], case["name"]
            stream.reset()
            stream.prefill_messages(case["messages"])
            assert list(stream.session.history) == case["prompt_ids"], case["name"]


def test_three_turns_prefill_only_new_tokens() -> None:
    msgs = [{"role": "user", "content": "Who are you?"}]
    counts, lengths = [], []
    with open_stream(TINY_BUNDLE, backend="llama.cpp", threads=1, max_tokens=32) as stream:
        for turn in range(3):
            counts.append(stream.prefill_messages(msgs))
            reply = stream.text()
            lengths.append(stream.session.n_past)
            msgs += [{"role": "assistant", "content": reply},
                     {"role": "user", "content": f"And then, part {turn}?"}]
        full = stream.session.tokenize(render_chat(TEMPLATE, msgs[:-2],
                                                   **stream.session.template_tokens),
                                       add_special=False)
    assert counts[0] > 0
    # turns 2 and 3 prefill only what is new: far fewer tokens than the conversation so far
    for turn in (1, 2):
        assert 0 < counts[turn] < lengths[turn - 1] / 2, (counts, lengths)
    assert counts[2] < len(full) / 2


def test_chat_reply_ends_at_end_of_turn() -> None:
    case = next(c for c in ORACLE["prompts"] if c["name"] == "chat_math")
    stop = case["first_stop_index"]
    with open_stream(TINY_BUNDLE, backend="llama.cpp", threads=1, max_tokens=64) as stream:
        stream.prefill_messages([{"role": "user", "content": "What is two plus two?"}])
        assert stream.session.history == tuple(case["prompt_ids"])
        steps = list(stream)
    assert steps[-1].finish_reason == "eos"
    assert [t for st in steps for t in st.tokens] == case["continuation_ids"][: stop + 1]
    assert "".join(st.text for st in steps) == case["text_until_stop"]


def test_generate_chat_one_call() -> None:
    reply = generate_chat(TINY_BUNDLE, [{"role": "user", "content": "What is two plus two?"}],
                          backend="llama.cpp", threads=1, max_tokens=64)
    assert reply.strip()


def test_model_without_template_names_the_option(tmp_path: Path) -> None:
    class Plugin:
        @hookimpl
        def eliza_backends_factories(self) -> list[ScriptedFactory]:
            return [ScriptedFactory()]

    registry = Registry(entry_points=False)
    registry.register(Plugin(), name="p")
    bundle = make_bundle(tmp_path / "b", "m.scripted")
    with open_stream(bundle, registry=registry, environ={}) as stream, \
            pytest.raises(UnsupportedOperationError, match="chat_template"):
        stream.prefill_messages(MSGS)
    with open_stream(bundle, registry=registry, environ={}, max_tokens=3,
                     chat_template="{% for m in messages %}{{ m.content }}{% endfor %}") as s:
        assert s.prefill_messages(MSGS) == 2  # "hi" as two byte tokens
        assert s.next().tokens


def test_cli_chat_in_a_real_terminal() -> None:
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k != "ELIZA_LLM_BACKEND"}
    proc = subprocess.Popen([sys.executable, "-m", "eliza_backends", "chat", str(TINY_BUNDLE),
                             "--threads", "1", "--max-tokens", "48"],
                            stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    buf = b""

    def read_until(marker: bytes, timeout: float = 60) -> bytes:
        nonlocal buf
        deadline = time.monotonic() + timeout
        while marker not in buf and time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    buf += os.read(master, 4096)
                except OSError:
                    break
        assert marker in buf, buf.decode(errors="replace")
        out, buf = buf, b""
        return out

    try:
        read_until(b"> ")
        os.write(master, b"Who are you?\n")
        first = read_until(b"> ")
        assert b"prefilled" in first and b"new tokens" in first
        os.write(master, b"Tell me more.\n")
        second = read_until(b"> ")
        assert b"prefilled" in second
        os.write(master, b"/quit\n")
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
