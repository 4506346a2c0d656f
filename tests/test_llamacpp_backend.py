"""The llama.cpp backend on the tiny bundle: the conformance kit (oracle parity:
test_oracle_parity.py), direct-runtime parity, long-prefill cancel, slots across models, and
GGUF validation before llama.cpp."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import pytest
from conftest import TINY_BUNDLE

pytest.importorskip("llama_cpp")

from eliza_llamacpp import LlamaCppFactory

from eliza_backends import (
    BundleError,
    CancelledError,
    Factory,
    InferenceContext,
    InvalidArgumentError,
    SlotError,
    StreamConfig,
    open_stream,
)
from eliza_backends.testing import BackendConformance, generated_tokens, run_to_end

ORACLE = json.loads((TINY_BUNDLE / "oracle.json").read_text())


class TestLlamaCppConformance(BackendConformance):
    @pytest.fixture
    def factory(self) -> Factory:
        return LlamaCppFactory()

    @pytest.fixture
    def bundle_dir(self) -> Path:
        return TINY_BUNDLE


def test_seam_equals_llama_cpp_used_directly() -> None:
    from direct_runtimes import llamacpp_greedy

    gguf = TINY_BUNDLE / "text" / "tiny-f16.gguf"
    for case in ORACLE["prompts"]:
        n = len(case["continuation_ids"])
        with open_stream(TINY_BUNDLE, backend="llamacpp", max_tokens=n, ignore_eos=True,
                         threads=1) as stream:
            stream.prefill(case["prompt_ids"])
            got = [t for step in stream for t in step.tokens]
        assert got == llamacpp_greedy(gguf, case["prompt_ids"], n)


@pytest.mark.parametrize(("kv", "flash"), [("f32", "off"), ("f32", "auto"), ("q8_0", "on")])
def test_kv_cache_type_equals_llama_cpp_used_directly(kv: str, flash: str,
                                                      tmp_path: Path) -> None:
    """``kv_cache_type`` is llama.cpp's own type_k/type_v: the same greedy tokens as
    ``llama_cpp.Llama`` with that cache, and a saved slot (the KV cache's bytes) of the size that
    type gives: twice the default f16 cache's for f32, about half for q8_0 (so the option is
    not ignored)."""
    import llama_cpp
    from direct_runtimes import llamacpp_greedy

    ggml = {"f32": llama_cpp.GGML_TYPE_F32, "q8_0": llama_cpp.GGML_TYPE_Q8_0}[kv]
    gguf = TINY_BUNDLE / "text" / "tiny-f16.gguf"
    sizes = {}
    for cache in (kv, "f16"):
        options = {"llama.cpp": {"kv_cache_type": cache, "flash_attention": flash}}
        with open_stream(TINY_BUNDLE, backend="llama.cpp", options=options, max_tokens=32,
                         ignore_eos=True, threads=1) as stream:
            ids = stream.session.tokenize("the quick brown fox jumps over the lazy dog " * 8)
            stream.prefill(ids)
            got = [t for step in stream for t in step.tokens]
            stream.save_slot(tmp_path / cache)
            sizes[cache] = (tmp_path / cache).stat().st_size
        if cache == kv:
            assert got == llamacpp_greedy(gguf, ids, 32, kv_type=ggml, flash_attn=flash != "off")
    ratio = sizes[kv] / sizes["f16"]
    assert (1.8 < ratio < 2.2) if kv == "f32" else (0.4 < ratio < 0.7), sizes


def test_quantized_kv_cache_without_flash_attention_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="needs flash_attention"):
        open_stream(TINY_BUNDLE, backend="llama.cpp",
                    options={"llama.cpp": {"kv_cache_type": "q8_0", "flash_attention": "off"}})


def test_text_prompt_tokenizes_like_the_oracle() -> None:
    with open_stream(TINY_BUNDLE, backend="llama.cpp", threads=1) as stream:
        for case in ORACLE["prompts"]:
            if case["kind"] == "chat":
                continue
            assert stream.session.tokenize(case["text"]) == case["prompt_ids"]


def test_sessions_share_one_model_load() -> None:
    factory = LlamaCppFactory()
    cfg = StreamConfig(threads=1, context_size=256, batch_size=64)
    with InferenceContext(TINY_BUNDLE) as ctx:
        a = factory.open(ctx, cfg)
        b = factory.open(ctx, cfg)
        assert a._model is b._model  # type: ignore[attr-defined]
        assert len(ctx._shared) == 1
    assert a.closed and b.closed  # closing the context closed its sessions first


@pytest.fixture(scope="module")
def long_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight llama (4 layers, hidden 256, vocab 32000) whose 4000-token prefill takes
    long enough to interrupt."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent.parent / "tools"))
    from make_random_gguf import make

    bundle = tmp_path_factory.mktemp("long")
    make(bundle / "text" / "small.gguf", preset="small", qtype="f16")
    return bundle


def test_cancel_interrupts_a_long_prefill_quickly(long_model: Path) -> None:
    cfg = dict(backend="llama.cpp", context_size=4096, batch_size=512, threads=1)
    with open_stream(long_model, **cfg) as stream:
        ids = (stream.session.tokenize("the quick brown fox " * 800))[:4000]
        t0 = time.perf_counter()
        stream.prefill(ids)
        full = time.perf_counter() - t0
        stream.reset()
        timer = threading.Timer(full / 4, stream.cancel)
        t0 = time.perf_counter()
        timer.start()
        with pytest.raises(CancelledError):
            stream.prefill(ids)
        latency = time.perf_counter() - t0 - full / 4
        timer.join()
        assert stream.session.n_past == 0
        stream.reset()
        stream.prefill(ids[:8])
        assert stream.next().tokens
    # one 512-token chunk is at most 1/8 of the prefill; allow scheduling noise
    assert latency < max(0.25 * full, 0.2), (latency, full)


def test_slot_from_another_model_is_refused(long_model: Path, tmp_path: Path) -> None:
    slot = tmp_path / "tiny.slot"
    with open_stream(TINY_BUNDLE, backend="llama.cpp", threads=1) as tiny:
        tiny.prefill(ORACLE["prompts"][0]["prompt_ids"])
        tiny.session.save_slot(slot)
    with open_stream(long_model, backend="llama.cpp", threads=1, context_size=256,
                     batch_size=64) as other:
        with pytest.raises(SlotError, match="different model"):
            other.session.restore_slot(slot)
        other.prefill([1, 2, 3])
        assert other.next().tokens


def test_slot_save_is_atomic_over_an_existing_file(tmp_path: Path) -> None:
    slot = tmp_path / "s.slot"
    with open_stream(TINY_BUNDLE, backend="llama.cpp", threads=1, ignore_eos=True) as s:
        s.prefill(ORACLE["prompts"][0]["prompt_ids"])
        s.session.save_slot(slot)
        first = slot.read_bytes()
        s.next(4)
        s.session.save_slot(slot)
        assert slot.read_bytes() != first
        assert [p.name for p in tmp_path.iterdir()] == ["s.slot"]  # no temp files left


def _copy_bundle_with(tmp_path: Path, data: bytes) -> Path:
    bundle = tmp_path / "bad"
    (bundle / "text").mkdir(parents=True)
    (bundle / "text" / "model.gguf").write_bytes(data)
    return bundle


@pytest.mark.parametrize("mutate", ["magic", "version", "truncated_header", "truncated_data",
                                    "empty"])
def test_corrupted_gguf_is_a_bundle_error(tmp_path: Path, mutate: str) -> None:
    good = (TINY_BUNDLE / "text" / "tiny-f16.gguf").read_bytes()
    data = {
        "magic": b"GGUX" + good[4:],
        "version": good[:4] + (99).to_bytes(4, "little") + good[8:],
        "truncated_header": good[:300],
        "truncated_data": good[: len(good) - 1000],
        "empty": b"",
    }[mutate]
    bundle = _copy_bundle_with(tmp_path, data)
    with pytest.raises(BundleError):
        open_stream(bundle, backend="llama.cpp")


def test_gguf_check_accepts_the_real_files() -> None:
    from eliza_llamacpp.gguf_header import check_gguf

    path = TINY_BUNDLE / "text" / "tiny-f16.gguf"
    header = check_gguf(path)
    assert header.version == 3 and header.n_tensors == 21 and header.n_kv == 26
    assert header.size == path.stat().st_size


def test_generation_with_sampling_runs_and_is_seeded() -> None:
    outs = []
    for _ in range(2):
        with open_stream(TINY_BUNDLE, backend="llama.cpp", temperature=0.9, top_k=40,
                         top_p=0.95, min_p=0.05, repeat_penalty=1.1, seed=42, threads=1,
                         max_tokens=24, ignore_eos=True) as s:
            s.prefill("Four score")
            outs.append(generated_tokens(run_to_end(s.session)))
    assert outs[0] == outs[1] and len(outs[0]) == 24


def test_copying_the_bundle_keeps_it_servable(tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(TINY_BUNDLE, copy)
    with open_stream(copy, backend="llama.cpp", threads=1, max_tokens=4) as s:
        s.prefill("Four")
        assert s.text() is not None


_DEFERRED_PACKAGE_PROBE = """
import ctypes, sys
from eliza_backends import open_stream
with open_stream(sys.argv[1], backend="llama.cpp", max_tokens=1, threads=1) as stream:
    stream.prefill("Four score and seven years ago")
    first = stream.next().tokens
print(sorted(m for m in ("llama_cpp.llama", "jinja2", "diskcache",
                         "eliza_backends.structured.constraint",
                         "eliza_backends.structured.logprobs") if m in sys.modules))
import llama_cpp
from llama_cpp import Llama
from eliza_llamacpp import model
print(llama_cpp.__version__ in model.RUNTIME, Llama.__module__, first != [])
callback, user = model.lc.llama_log_callback(), ctypes.c_void_p()
model.lc.llama_log_get(ctypes.byref(callback), ctypes.byref(user))
print(ctypes.cast(callback, ctypes.c_void_p).value ==
      ctypes.cast(model._log_to_logging, ctypes.c_void_p).value)
"""


def test_the_seam_never_runs_llama_cpps_high_level_half() -> None:
    """A first token imports llama-cpp-python's ctypes bindings only (not ``llama_cpp.llama``:
    jinja2's and diskcache's import, issue 42), nor the structured-output constraint and
    logprob modules a turn without them does not use; ``import llama_cpp`` / ``from llama_cpp
    import Llama`` afterwards still work, and llama.cpp's log lines stay routed to the plugin's
    logger after llama-cpp-python's ``__init__`` installed its own callback."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _DEFERRED_PACKAGE_PROBE, str(TINY_BUNDLE)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[]", "True llama_cpp.llama True", "True"]


_CONCURRENT_PACKAGE_PROBE = """
import sys, threading
from eliza_llamacpp.bindings import lc
assert type(sys.modules["llama_cpp"]).__name__ == "_DeferredPackage"
import llama_cpp
got, start = [], threading.Barrier(4)
def use():
    start.wait()
    got.append((llama_cpp.Llama.__name__, llama_cpp.LlamaGrammar.__name__))
threads = [threading.Thread(target=use) for _ in range(4)]
for t in threads: t.start()
for t in threads: t.join()
print(sorted(set(got)), len(got), type(sys.modules["llama_cpp"]).__name__,
      llama_cpp.llama_decode is lc.llama_decode)
"""


def test_the_deferred_llama_cpp_package_runs_once_for_concurrent_threads() -> None:
    """Four threads looking up ``llama_cpp.Llama`` at once on the package the plugin deferred
    (eliza_llamacpp.bindings): one runs its ``__init__``, the others wait and all see the whole
    package; afterwards it is a plain module holding the same bindings."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _CONCURRENT_PACKAGE_PROBE],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[('Llama',", "'LlamaGrammar')]", "4", "module", "True"]
