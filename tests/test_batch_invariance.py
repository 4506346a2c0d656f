"""Batch invariance on llama.cpp (issues 37 and 39): a greedy reply on a batched context equals
the same request served alone, whatever the other sequences do.

llama.cpp's CPU kernels pick their path by the shape of the batch (tinyBLAS from 2 rows for
f32 weights, vec_dot for 1; flash attention tiled from 64 rows of one sequence, split over the
cells for one row alone), so a row beside other sequences' rows rounds differently. On
gemma4-mm-tiny (f32, 32-token sliding window) that flips a near-tie (0.0009 nats apart) in one
of three ~300-token prompts decoded together, in every run measured
(benchmarks/swa_batching_repro.py). One sequence per ``llama_decode`` (``batch_invariant``,
the default for such weights) gives every sequence its solo kernels; the steps shared by
several sequences are the default for the other quantized types (vec_dot at every size) and
the opt-in elsewhere (``batch_invariant=False``, tests/test_batching.py).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT

pytest.importorskip("llama_cpp")

from eliza_backends import InferenceContext, InvalidArgumentError, Stream, open_stream
from eliza_backends.backend import Piece, StepScheduler

BUNDLE = ROOT / "examples" / "bundles" / "gemma4-mm-tiny"
CONFIG: dict[str, Any] = {"backend": "llama.cpp", "max_tokens": 40, "ignore_eos": True,
                          "context_size": 512, "batch_size": 256}
#: Text-only prompts of ~280-310 tokens, far past the model's 32-token window.
TEXTS = ["Tell me a long story about a lighthouse keeper and the ships. " * 9,
         "Name three colors and describe the sea at night in detail please. " * 8,
         "What is the capital of France and why is it famous for bread? " * 10]


def _reply(stream: Stream, text: str, together: threading.Barrier | None = None) -> list[int]:
    stream.reset()
    if together is not None:
        together.wait(timeout=60)  # the prefills start together, so their pieces meet
    stream.prefill(text)
    return [t for step in stream for t in step.tokens]


def _batched(**options: Any) -> tuple[list[list[int]], Any]:
    """The three replies decoded at once on a ``parallel=3`` context, and its step stats."""
    config = {**CONFIG, "options": {"llama.cpp": options}} if options else CONFIG
    with InferenceContext(BUNDLE, parallel=3) as ctx:
        streams = [open_stream(ctx, **config) for _ in TEXTS]
        together = threading.Barrier(len(TEXTS))
        try:
            with ThreadPoolExecutor(len(TEXTS)) as pool:
                got = list(pool.map(lambda s, t: _reply(s, t, together), streams, TEXTS))
            stats = ctx.batch_stats()
        finally:
            for s in streams:
                s.close()
    return got, stats


@pytest.fixture(scope="module")
def alone() -> list[list[int]]:
    with open_stream(BUNDLE, **CONFIG) as solo:
        return [_reply(solo, t) for t in TEXTS]


def test_a_sliding_window_model_batched_gives_every_reply_its_solo_one(
        alone: list[list[int]]) -> None:
    """gemma4-mm-tiny, three long prompts at once, twice: every reply is its solo reply, and
    the steps carried one sequence each."""
    for _run in range(2):
        got, stats = _batched()
        assert got == alone
        assert stats.steps > 0 and stats.batch_sizes == {1: stats.steps}


def test_the_opt_in_shared_steps_batch_the_sequences_together(alone: list[list[int]]) -> None:
    """``batch_invariant=False``: the steps carry several sequences (what it is for); its
    replies are compared with the solo ones only up to llama.cpp's kernel rounding, which this
    model shows at a near-tie (the module docstring), so only the lengths are checked here."""
    got, stats = _batched(batch_invariant=False)
    assert [len(g) for g in got] == [len(a) for a in alone]
    assert stats.mean_batch > 1.2, stats.batch_sizes  # (3 streams; a loaded machine delays some)


def test_the_default_copies_only_whole_batches_of_a_shared_prefix() -> None:
    """Batch size 64: a prompt sharing ~200 tokens with a live sequence copies its first three
    whole batches (192 positions) and decodes the rest, and its reply is its solo reply; one
    sharing fewer than 64 tokens copies nothing (a lone context computes that piece with other
    kernels)."""
    config = {**CONFIG, "batch_size": 64}
    head = TEXTS[0]
    longer, shorter = head[:390] + TEXTS[1][:300], head[:100] + TEXTS[2][:300]
    with open_stream(BUNDLE, **config) as solo:
        want = [_reply(solo, t) for t in (longer, shorter)]
    with InferenceContext(BUNDLE, parallel=3) as ctx:
        first, second, third = (open_stream(ctx, **config) for _ in range(3))
        try:
            engine = first.session._lane.engine  # type: ignore[attr-defined]
            _reply(first, head)
            assert _reply(second, longer) == want[0]
            assert engine.prefill_copied == 192
            assert _reply(third, shorter) == want[1]
            assert engine.prefill_copied == 192
        finally:
            for s in (first, second, third):
                s.close()


def _q4_1_bundle(root: Path) -> Path:
    """A bundle holding the tiny model quantized to Q4_1 by llama.cpp itself (a K-free,
    vec_dot-only type: shared steps by default)."""
    import llama_cpp as lc

    (root / "text").mkdir(parents=True)
    params = lc.llama_model_quantize_default_params()
    params.ftype = lc.LLAMA_FTYPE_MOSTLY_Q4_1
    source = ROOT / "examples" / "bundles" / "tiny" / "text" / "tiny-f16.gguf"
    out = root / "text" / "tiny-q4_1.gguf"
    assert lc.llama_model_quantize(str(source).encode(), str(out).encode(), params) == 0
    return root


def _invariant(bundle: Path, **options: Any) -> bool:
    config = {"backend": "llama.cpp", "context_size": 256, "batch_size": 64,
              "options": {"llama.cpp": options} if options else {}}
    with InferenceContext(bundle, parallel=2) as ctx, open_stream(ctx, **config) as stream:
        return bool(stream.session._lane.engine.invariant)  # type: ignore[attr-defined]


def test_the_default_follows_the_weights_and_the_option_overrides_it(tmp_path: Path) -> None:
    """Unset, ``batch_invariant`` is on for weights whose matmul changes kernels between one
    row and two (f16 here: tinyBLAS) and off for Q4_1 (vec_dot at every size); given, it
    wins either way."""
    f16 = ROOT / "examples" / "bundles" / "tiny"
    q4_1 = _q4_1_bundle(tmp_path / "q4_1")
    assert _invariant(f16) is True
    assert _invariant(q4_1) is False
    assert _invariant(f16, batch_invariant=False) is False
    assert _invariant(q4_1, batch_invariant=True) is True


def _recording(log: list[list[Piece]], max_tokens: int) -> StepScheduler:
    def decode(pieces: Sequence[Piece]) -> None:
        log.append(list(pieces))

    return StepScheduler(decode, max_tokens, gather_window=0.05, max_sequences=1)


def test_one_sequence_per_step_takes_turns_and_cuts_a_long_prefill_at_the_budget() -> None:
    """``max_sequences=1``: two decoding sequences and a 20-token prefill (budget 8) take
    turns: the prefill is not held back behind the decodes, goes in pieces of 8 from its start
    (as alone), and every step carries one sequence."""
    log: list[list[Piece]] = []
    sched = _recording(log, max_tokens=8)
    together = threading.Barrier(3)
    done: dict[str, Any] = {}

    def decoder(seq: str) -> None:
        together.wait(timeout=10)
        for pos in range(10):
            sched.submit(seq, [pos], pos, 1, lambda p: None)
        done[seq] = True

    def prefiller() -> None:
        together.wait(timeout=10)
        done["p"] = sched.submit("p", list(range(20)), 0, 1, lambda p: p.start)

    threads = [threading.Thread(target=f, args=a) for f, a in
               [(decoder, ("a",)), (decoder, ("b",)), (prefiller, ())]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert done == {"a": True, "b": True, "p": 16}
    assert all(len(step) == 1 for step in log)
    prefill = [(step[0].start, len(step[0].tokens)) for step in log if step[0].seq == "p"]
    assert prefill == [(0, 8), (8, 8), (16, 4)]
    first_prefill = next(i for i, step in enumerate(log) if step[0].seq == "p")
    last_decode = max(i for i, step in enumerate(log) if step[0].seq != "p")
    assert first_prefill < last_decode, "the prefill waited for every decode to finish"
    assert sched.stats().batch_sizes == {1: len(log)}


def test_max_sequences_below_one_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="max_sequences"):
        StepScheduler(lambda pieces: None, 8, max_sequences=0)
