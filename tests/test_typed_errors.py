"""Typed errors instead of raw exceptions (issue 15, item 11): what each backend used to leak
as PermissionError, ValueError, UnicodeEncodeError, TypeError or UnicodeDecodeError is an
ElizaError with a status code and a message that says what to do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TINY_BUNDLE

from eliza_backends import BundleError, InvalidArgumentError, SlotError, Status, open_stream

LONE_SURROGATE = json.loads('"caf\\u00e9 \\ud800 ok"')

BACKENDS = [
    pytest.param("llama.cpp", {}, "llama_cpp", id="llama.cpp"),
    pytest.param("litert-lm", {"litert-lm": {"session": "interpreter"}}, "ai_edge_litert",
                 id="litert-interpreter"),
    pytest.param("litert-lm", {"litert-lm": {"session": "engine"}}, "litert_lm",
                 id="litert-engine"),
    pytest.param("mlx", {}, "mlx_lm", id="mlx"),
]


@pytest.mark.parametrize(("backend", "options", "module"), BACKENDS)
def test_text_with_a_lone_surrogate_is_an_invalid_argument(backend: str, options: dict,
                                                           module: str) -> None:
    pytest.importorskip(module)
    with open_stream(TINY_BUNDLE, backend=backend, options=options, threads=1,
                     max_tokens=4) as stream:
        for call in (lambda: stream.session.tokenize(LONE_SURROGATE),
                     lambda: stream.prefill(LONE_SURROGATE),
                     lambda: stream.prefill_messages([{"role": "user",
                                                       "content": LONE_SURROGATE}])):
            with pytest.raises(InvalidArgumentError, match="lone surrogate") as caught:
                call()
            assert caught.value.code == Status.ERR_INVALID_ARG
        stream.prefill("Four score")  # the session is untouched
        assert stream.next().tokens


@pytest.fixture
def prefilled() -> object:
    pytest.importorskip("llama_cpp")
    with open_stream(TINY_BUNDLE, backend="llama.cpp", threads=1, max_tokens=4) as stream:
        stream.prefill("Four score")
        yield stream


@pytest.mark.parametrize("where", ["proc", "nul", "parent_is_a_file"])
def test_save_slot_to_a_bad_place_is_a_slot_io_error(prefilled: object, tmp_path: Path,
                                                     where: str) -> None:
    """/proc refuses new files even to root (a chmod-ed directory would not stop root)."""
    stream = prefilled
    (tmp_path / "file").write_text("x")
    path = {"proc": Path("/proc/s.slot"), "nul": str(tmp_path / "a\0b.slot"),
            "parent_is_a_file": tmp_path / "file" / "s.slot"}[where]
    with pytest.raises(SlotError) as caught:
        stream.session.save_slot(path)  # type: ignore[attr-defined]
    assert caught.value.code == Status.ERR_IO
    with pytest.raises(SlotError):
        stream.session.restore_slot(path)  # type: ignore[attr-defined]
    assert stream.next().tokens  # type: ignore[attr-defined]


def test_a_non_utf8_chat_template_in_a_gguf_is_a_bundle_error(tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp")
    gguf_fuzz = pytest.importorskip("gguf_fuzz")
    bundle = tmp_path / "b"
    (bundle / "text").mkdir(parents=True)
    (bundle / "text" / "m.gguf").write_bytes(gguf_fuzz.build(
        [{"op": "set", "key": "tokenizer.chat_template", "type": 8,
          "value": "{{ bos_token }}\udcff\udcfe"}]))
    with pytest.raises(BundleError, match="chat_template is not UTF-8"):
        open_stream(bundle, backend="llama.cpp", threads=1)
