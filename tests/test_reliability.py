"""Reliability: kills mid-save, cancel races, busy sessions, RSS under churn and long decodes,
fuzzed parsers (manifest, GGUF header, slot files) with a replayed regression corpus, and no
code-execution paths on loading."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT, TINY_BUNDLE
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eliza_backends import (
    BundleError,
    CancelledError,
    ElizaError,
    InferenceContext,
    SlotError,
    StreamConfig,
    load_manifest,
    open_stream,
)
from eliza_backends.runtime.slots import read_slot

CORPUS = Path(__file__).parent / "corpus"
ORACLE = json.loads((TINY_BUNDLE / "oracle.json").read_text())
CASE = ORACLE["prompts"][0]


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


# ---------------------------------------------------------------------------- kills


SAVER = textwrap.dedent("""
    import sys
    from eliza_backends import open_stream
    path = sys.argv[1]
    with open_stream(sys.argv[2], backend="llama.cpp", threads=1, context_size=4096,
                     ignore_eos=True, max_tokens=100000) as s:
        s.prefill(list(map(int, sys.argv[3].split(","))))
        s.session.save_slot(path)
        print("ready", flush=True)
        while True:
            s.next(8)
            s.session.save_slot(path)
""")


@pytest.mark.slow
def test_sigkill_during_save_slot_keeps_the_previous_slot(tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp")
    slot = tmp_path / "slot.bin"
    rng = random.Random(0)
    survived = 0
    for _ in range(12):
        proc = subprocess.Popen([sys.executable, "-c", SAVER, str(slot), str(TINY_BUNDLE),
                                 ",".join(map(str, CASE["prompt_ids"]))],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.0, 0.3))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        with open_stream(TINY_BUNDLE, backend="llama.cpp", threads=1, context_size=4096,
                         ignore_eos=True, max_tokens=4) as s:
            s.session.restore_slot(slot)  # the last complete save, never a torn file
            assert s.session.n_past >= len(CASE["prompt_ids"])
            assert s.next().tokens
        survived += 1
    assert survived == 12


# ---------------------------------------------------------------------------- races


BACKENDS = [
    pytest.param("llama.cpp", {}, "llama_cpp", id="llama.cpp"),
    pytest.param("litert-lm", {}, "ai_edge_litert", id="litert-lm"),
    pytest.param("mlx", {}, "mlx_lm", id="mlx"),
]


@pytest.fixture
def quick_gil_handover() -> Iterator[None]:
    """Hand the GIL to a waiting thread after 0.1 ms instead of 5 ms, for this test only. The
    LiteRT compiled runtime holds the GIL inside each native run (ai-edge-litert does not
    release it; its Interpreter does), so a canceller thread gets in only between runs, and
    with the default interval only 5 ms later: a 3 ms prefill then ends before most cancels
    aimed inside it run. The cancel itself is honoured at the next run either way."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)
    yield
    sys.setswitchinterval(before)


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["prefill", "decode"])
@pytest.mark.parametrize(("backend", "options", "module"), BACKENDS)
def test_cancel_at_random_moments_never_breaks_a_session(phase: str, backend: str,
                                                         options: dict, module: str,
                                                         quick_gil_handover: None) -> None:
    pytest.importorskip(module)
    rng = random.Random(1)
    outcomes = {"finished": 0, "cancelled": 0}
    with open_stream(TINY_BUNDLE, backend=backend, options=options, threads=1,
                     context_size=4096, batch_size=32, ignore_eos=True, max_tokens=3000,
                     tokens_per_step=3000) as stream:
        s = stream.session
        n_long = min(3000, s.context_size - 8)
        long_ids = (s.tokenize("the quick brown fox jumps over the lazy dog " * 200,
                               add_special=False))[:n_long]

        def start() -> None:
            s.reset()
            if phase == "decode":
                s.prefill(CASE["prompt_ids"])

        def call() -> None:
            if phase == "prefill":
                s.prefill(long_ids)
            else:
                s.next()

        # the cancels are aimed inside the call: at random moments of its measured length (a
        # fixed 0-10 ms missed most LiteRT calls on a faster machine)
        durations = []
        for _ in range(3):
            start()
            t0 = time.perf_counter()
            call()
            durations.append(time.perf_counter() - t0)
        duration = sorted(durations)[1]
        # a cancel counts where it landed: inside the call (fired after the call began and
        # before it returned) or after it. On a loaded machine the timer thread runs late and
        # many land after the call, so trials go on until enough landed inside (bounded)
        inside = cancelled_inside = trials = 0
        while inside < 15 and trials < 120:
            trials += 1
            start()
            fired: list[float] = []

            def fire(fired: list[float] = fired) -> None:
                fired.append(time.perf_counter())
                s.cancel()

            timer = threading.Timer(rng.uniform(0, 0.5 * duration), fire)
            t0 = time.perf_counter()
            timer.start()
            try:
                call()
                outcomes["finished"] += 1
                cancelled = False
            except CancelledError:
                outcomes["cancelled"] += 1
                cancelled = True
            t1 = time.perf_counter()
            timer.join()
            if fired and t0 <= fired[0] < t1:
                inside += 1
                cancelled_inside += cancelled
            s.reset()
            s.prefill(CASE["prompt_ids"])
            assert list(s.next(32).tokens) == CASE["continuation_ids"]
    assert outcomes["cancelled"] + outcomes["finished"] == trials
    # a cancel never stops a call it did not land in
    assert outcomes["cancelled"] == cancelled_inside, outcomes
    # a cancel that lands inside the call stops it (the backends check between native calls,
    # a few per prefill chunk or token; one landing in the call's last native run is missed,
    # and the cancels are aimed at the first half of the call). Rehearsal 3 and stop 34's CI
    # caught only 1-3 of 15 on LiteRT: its sampler's numpy calls kept the canceller thread
    # from the GIL until the call ended (test_another_thread_runs_during_a_long_decode); since
    # the session's GIL handover, 15 of 15
    assert inside >= 15, (f"only {inside} of {trials} cancels landed inside the call",
                          f"call {duration * 1e3:.1f} ms")
    assert cancelled_inside >= inside / 2, (outcomes, inside, f"call {duration * 1e3:.1f} ms")


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "options", "module"), BACKENDS)
def test_another_thread_runs_during_a_long_decode(backend: str, options: dict,
                                                  module: str) -> None:
    """A session call lets the process's other Python threads run (a canceller, a server's
    event loop), at CPython's default 5 ms switch interval. The LiteRT CompiledModel holds the
    GIL through each run and the sampler's numpy argmax releases it for microseconds per token,
    which CPython counts as a switch: a waiting thread never asked for the GIL and slept through
    a whole 40 ms decode (0 wakes inside it) until the session handed the GIL over once per
    switch interval."""
    pytest.importorskip(module)
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    wakes: list[float] = []
    done = threading.Event()

    def probe() -> None:
        while not done.is_set():
            time.sleep(0.001)
            wakes.append(time.perf_counter())

    try:
        with open_stream(TINY_BUNDLE, backend=backend, options=options, threads=1,
                         ignore_eos=True, max_tokens=400) as stream:
            s = stream.session
            s.prefill(CASE["prompt_ids"])
            thread = threading.Thread(target=probe)
            thread.start()
            time.sleep(0.01)
            t0 = time.perf_counter()
            step = s.next(400)
            t1 = time.perf_counter()
            done.set()
            thread.join()
    finally:
        sys.setswitchinterval(before)
    inside = sum(t0 < w < t1 for w in wakes)
    assert len(step.tokens) >= 300
    # one wake per 5 ms interval at most (about 9 in LiteRT's 45 ms); 3 leaves room for a
    # loaded machine's late wakes
    assert inside >= 3, f"{inside} wakes during a {(t1 - t0) * 1e3:.0f} ms next()"


def test_cancel_races_on_the_scripted_backend_too(tmp_path: Path) -> None:
    from conftest import make_bundle
    from scripted_backend import ScriptedFactory

    bundle = make_bundle(tmp_path / "b", "m.scripted")
    rng = random.Random(2)
    with InferenceContext(bundle) as ctx:
        s = ScriptedFactory().open(ctx, StreamConfig(context_size=100_000, batch_size=16,
                                                     max_tokens=5000, ignore_eos=True,
                                                     tokens_per_step=5000))
        for _ in range(30):
            s.reset()
            timer = threading.Timer(rng.uniform(0, 0.01), s.cancel)
            timer.start()
            try:
                s.prefill([65] * 4000)
                s.next()
            except CancelledError:
                pass
            timer.join()
            s.reset()
            s.prefill([65, 66])
            assert s.next(3).tokens


# ---------------------------------------------------------------------------- memory


@pytest.mark.slow
def test_session_and_context_churn_keeps_rss_flat() -> None:
    pytest.importorskip("llama_cpp")
    cfg = StreamConfig(threads=1, context_size=256, batch_size=64, max_tokens=8)

    def churn(n: int) -> None:
        for _ in range(n):
            with open_stream(TINY_BUNDLE, cfg, backend="llama.cpp") as s:
                s.prefill(CASE["prompt_ids"])
                s.text()

    churn(20)  # warm-up: allocator pools, lazy imports
    before = _rss_mb()
    churn(150)
    growth = _rss_mb() - before
    assert growth < 16, f"RSS grew {growth:.1f} MB over 150 open/close cycles"


@pytest.mark.slow
def test_long_decode_keeps_rss_flat() -> None:
    pytest.importorskip("llama_cpp")
    with open_stream(TINY_BUNDLE, backend="llama.cpp", threads=1, context_size=8192,
                     ignore_eos=True, max_tokens=7000, tokens_per_step=500) as s:
        s.prefill(CASE["prompt_ids"])
        s.next()
        s.next()
        before = _rss_mb()
        n = sum(len(step.tokens) for step in s)
        growth = _rss_mb() - before
    assert n > 5000
    assert growth < 8, f"RSS grew {growth:.1f} MB over {n} decoded tokens"


# ---------------------------------------------------------------------------- fuzzing


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10),
                                                                      children, max_size=4),
    max_leaves=20)


def _manifest_like() -> st.SearchStrategy[object]:
    path = st.sampled_from(["text/a.gguf", "../x", "/abs", "text/../../y", "", "text/d/f",
                            "~/z", "text\\\\w"]) | st.text(max_size=12)
    record = st.fixed_dictionaries({"path": path, "size": st.integers(-5, 10**12),
                                    "sha256": st.sampled_from(["0" * 64, "zz", ""])})
    artifact = st.fixed_dictionaries({
        "path": path, "format": st.sampled_from(["gguf", "mlx", "x"]),
        "backend": st.none() | st.text(max_size=8),
        "files": st.lists(record, max_size=3)}, optional={"role": st.text(max_size=6)})
    return st.fixed_dictionaries({"schema_version": st.integers(0, 3), "name": st.text(max_size=8),
                                  "artifacts": st.lists(artifact, max_size=3)}) | json_values


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_manifest_like())
def test_fuzz_manifest_parser(tmp_path_factory: pytest.TempPathFactory, data: object) -> None:
    d = tmp_path_factory.mktemp("m")
    (d / "manifest.json").write_text(json.dumps(data))
    try:
        manifest = load_manifest(d)
    except BundleError:
        return
    for art in manifest.artifacts:  # whatever parsed is confined to the bundle
        for rec in art.files:
            assert not rec.path.startswith("/") and ".." not in rec.path.split("/")


def _gguf_check():  # type: ignore[no-untyped-def]
    mod = pytest.importorskip("eliza_llamacpp.gguf_header")
    return mod.check_gguf


GOOD_GGUF = (TINY_BUNDLE / "text" / "tiny-f16.gguf").read_bytes()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, len(GOOD_GGUF) - 1), st.binary(min_size=1, max_size=8),
       st.integers(0, len(GOOD_GGUF)))
def test_fuzz_gguf_header(tmp_path_factory: pytest.TempPathFactory, at: int, patch: bytes,
                          cut: int) -> None:
    check = _gguf_check()
    data = (GOOD_GGUF[:at] + patch + GOOD_GGUF[at + len(patch):])[:max(cut, 0)]
    path = tmp_path_factory.mktemp("g") / "m.gguf"
    path.write_bytes(data)
    with contextlib.suppress(BundleError):
        check(path)


# the GGUF and TFLite folders are replayed through the real runtimes, in a child process, by
# test_gguf_fuzz.py and test_tflite_fuzz.py
@pytest.mark.parametrize("path", sorted(p for p in CORPUS.glob("*/*")
                                        if p.parent.name not in ("gguf", "gguf_values",
                                                                 "tflite")),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_regression_corpus(path: Path, tmp_path: Path) -> None:
    """Inputs that once found a bug (or probe a known edge) stay refused cleanly."""
    kind = path.parent.name
    if kind == "manifest":
        (tmp_path / "manifest.json").write_bytes(path.read_bytes())
        with pytest.raises(BundleError):
            load_manifest(tmp_path)
    elif kind == "slot":
        with pytest.raises(SlotError):
            read_slot(path, backend="llama.cpp", model_fingerprint="x", runtime="y")
    else:  # pragma: no cover - a new corpus folder must get a replay rule
        raise AssertionError(f"no replay rule for corpus folder {kind}")


# ---------------------------------------------------------------------------- safety


def test_no_code_execution_on_loading_paths() -> None:
    banned = re.compile(r"\b(pickle|marshal|torch\.load|yaml\.load|importlib\.import_module)\b"
                        r"|(?<![\w.])(eval|exec|__import__)\(")
    offenders = []
    for base in (ROOT / "src", ROOT / "plugins"):
        for py in base.rglob("*.py"):
            for n, line in enumerate(py.read_text().splitlines(), 1):
                code = line.split("#", 1)[0]
                if banned.search(code) and "ast.literal_eval" not in code:
                    offenders.append(f"{py.relative_to(ROOT)}:{n}: {line.strip()}")
    assert offenders == []


def test_a_bundle_cannot_name_code_to_import(tmp_path: Path) -> None:
    data = {"schema_version": 1, "name": "x", "artifacts": [], "plugin": "os:system"}
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(BundleError, match="unknown field"):
        load_manifest(tmp_path)


def test_errors_always_carry_a_status_code() -> None:
    for exc_type in ElizaError.__subclasses__():
        err = exc_type("x")
        assert int(err.code) < 0 and err.code.symbol.startswith("ELIZA_ERR_")
