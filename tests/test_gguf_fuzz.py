"""GGUF files whose values make llama.cpp abort: contained at load, or refused before decode.

The crash-oracle fuzzer (``tests/gguf_fuzz.py``) runs llama.cpp in a child process: every file
must load and decode, or raise an ElizaError; never abort, fault, hang or raise something
untyped. ``tests/corpus/gguf_values/`` keeps what it found on 98aaa27 (each file there says what
that build did with it) plus the cases issue 15 lists; all of them are replayed here.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import TINY_BUNDLE

pytest.importorskip("llama_cpp")

import gguf_fuzz

CORPUS = Path(__file__).parent / "corpus"


def _assert_clean(report: gguf_fuzz.Report) -> None:
    assert report.findings == [], report.describe_findings()


def test_value_corpus_is_refused_or_served_never_fatal() -> None:
    files = sorted((CORPUS / "gguf_values").glob("*.json"))
    assert len(files) >= 15
    recipes = [(p.name, json.loads(p.read_text())["recipe"]) for p in files]
    base = gguf_fuzz.BASE_GGUF.read_bytes()
    report = gguf_fuzz.run_files(
        (name, lambda r=recipe: gguf_fuzz.build(r, base)) for name, recipe in recipes)
    _assert_clean(report)
    verdicts = {label: (outcome, detail) for label, outcome, detail in report.verdicts}
    # every case issue 15 names is a bad file: a typed refusal with a reason, not a load
    for name, (outcome, detail) in verdicts.items():
        if name.startswith("issue15_"):
            assert outcome == "error" and detail.startswith("BundleError"), (name, detail)
    assert "byte-fallback" in verdicts["issue15_spm_model_on_bpe_vocab.json"][1]
    assert "epsilon" in verdicts["issue15_nan_rms_epsilon.json"][1]
    assert "id_to_token" in verdicts["issue15_duplicated_token.json"][1]


def test_layout_corpus_is_refused_by_the_loader() -> None:
    """The layout corpus (bad magic, huge counts and strings, nested arrays) through the real
    load path, not only the header check."""
    files = sorted((CORPUS / "gguf").glob("*.gguf"))
    report = gguf_fuzz.run_files((p.name, p.read_bytes) for p in files)
    _assert_clean(report)
    assert {outcome for _, outcome, _ in report.verdicts} == {"error"}, report.verdicts


def test_fuzz_gguf_quick() -> None:
    report = gguf_fuzz.run(list(gguf_fuzz.cases(seed=0, n=300)))
    _assert_clean(report)
    assert report.cases == 300 and report.outcomes.get("ok", 0) > 30  # not all refused


@pytest.mark.slow
def test_fuzz_gguf_values_10k() -> None:
    """≥ 10,000 cases (about 4 minutes on 2 busy cores): values, types, counts, missing and
    duplicated keys, the vocabulary, the tensor table, and bytes."""
    report = gguf_fuzz.run(list(gguf_fuzz.cases(seed=2, n=10_000)))
    print(f"gguf fuzz: {report.cases} cases in {report.seconds:.0f} s: {report.outcomes}")
    _assert_clean(report)
    assert report.cases == 10_000


def test_a_contained_abort_leaves_the_process_usable(tmp_path: Path) -> None:
    """In one process: a file that fails a GGML_ASSERT in the loader is a BundleError, the
    aborting thread is parked, and the good model still loads and decodes."""
    bad = tmp_path / "bad"
    (bad / "text").mkdir(parents=True)
    (bad / "text" / "m.gguf").write_bytes(gguf_fuzz.build(
        [{"op": "item", "key": "tokenizer.ggml.tokens", "index": 100, "copy_from": 101}]))
    code = textwrap.dedent("""
        import sys
        from eliza_backends import BundleError, open_stream
        for _ in range(3):
            try:
                open_stream(sys.argv[1], backend="llama.cpp", threads=1)
            except BundleError as exc:
                assert "GGML_ASSERT" in str(exc), exc
            else:
                raise SystemExit("loaded a file with a duplicated token")
        from eliza_llamacpp.native_guard import parked_threads
        with open_stream(sys.argv[2], backend="llama.cpp", threads=1, max_tokens=4) as s:
            s.prefill("Four score")
            print(parked_threads(), len(s.text()) > 0)
    """)
    out = subprocess.run([sys.executable, "-c", code, str(bad), str(TINY_BUNDLE)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["3", "True"]


def test_aborts_on_other_threads_still_abort() -> None:
    """Containment is for the loader's own thread: an assertion anywhere else keeps ggml's
    behaviour (message, then abort), so no failure becomes silent."""
    code = textwrap.dedent("""
        import ctypes, llama_cpp
        from eliza_llamacpp import native_guard
        native_guard.install()
        lib = llama_cpp.llama_cpp._lib
        lib.ggml_abort.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p]
        lib.ggml_abort(b"here.c", 1, b"deliberate")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env={"GGML_NO_BACKTRACE": "1", "PATH": "/usr/bin:/bin"})
    assert out.returncode == -6 and "deliberate" in out.stderr


def test_eog_tokens_equal_a_full_vocabulary_scan() -> None:
    import llama_cpp as lc
    from eliza_llamacpp import LlamaCppOptions
    from eliza_llamacpp.model import free_model, load_model

    model = load_model(TINY_BUNDLE / "text" / "tiny-f16.gguf", LlamaCppOptions())
    try:
        full = {t for t in range(model.info.vocab_size)
                if lc.llama_vocab_is_eog(model.vocab, t)}
        assert set(model.info.eog_token_ids) == full and full
    finally:
        free_model(model)
