"""MLX continuous batching (plugins/eliza_mlx: batch_engine, batched_session) on the tiny bundles:
the conformance kit on a ``parallel=4`` context, every batched sequence's greedy tokens against
the same prompt served alone (tiny, and gemma4-tiny's sliding window with prompts past it), a
cancel that disturbs no other row, per-sequence rewinds, seeded sampling independent of the
batch, the logits hook per row, and the engine really batching."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, TINY_BUNDLE

pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

from eliza_mlx import MLXFactory

from eliza_backends import (
    CancelledError,
    Factory,
    InferenceContext,
    SessionBusyError,
    Stream,
    open_stream,
)
from eliza_backends.testing import BackendConformance

GEMMA4_TINY = ROOT / "examples" / "bundles" / "gemma4-tiny"
N_TOKENS = 24


class TestBatchedMLXConformance(BackendConformance):
    """The whole kit, each session a row of a parallel=4 context's batch engine."""

    @pytest.fixture
    def factory(self) -> Factory:
        return MLXFactory()

    @pytest.fixture
    def bundle_dir(self) -> Path:
        return TINY_BUNDLE

    @pytest.fixture
    def context(self, bundle_dir: Path) -> Iterator[InferenceContext]:
        ctx = InferenceContext(bundle_dir, parallel=4)
        try:
            yield ctx
        finally:
            ctx.close()


# ------------------------------------------------------------------------------ helpers


def _prompts(vocab: int, lengths: tuple[int, ...], seed: int = 1) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(n)] for n in lengths]


def _open(ctx: InferenceContext, **cfg: Any) -> Stream:
    cfg.setdefault("max_tokens", N_TOKENS)
    cfg.setdefault("ignore_eos", True)
    return open_stream(ctx, backend="mlx", context_size=512, **cfg)


def _run(stream: Stream, prompt: list[int]) -> list[int]:
    stream.prefill(prompt)
    return [t for step in stream for t in step.tokens]


def _alone(bundle: Path, prompts: list[list[int]], **cfg: Any) -> list[list[int]]:
    """Each prompt served alone on an ordinary (unbatched) session."""
    with InferenceContext(bundle) as ctx:
        out = []
        for prompt in prompts:
            with _open(ctx, **cfg) as stream:
                assert not stream.session.capabilities.batched
                out.append(_run(stream, prompt))
        return out


def _together(streams: list[Stream], jobs: list[Callable[[Stream], Any]]) -> list[Any]:
    """Run ``jobs[i](streams[i])`` on one thread each, all at once; their results."""
    results: list[Any] = [None] * len(streams)
    errors: list[BaseException] = []
    start = threading.Barrier(len(streams))

    def work(i: int) -> None:
        try:
            start.wait()
            results[i] = jobs[i](streams[i])
        except BaseException as exc:  # (re-raised in the test thread)
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(streams))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a batched session hung"
    if errors:
        raise errors[0]
    return results


# ------------------------------------------------------------------------------ parity


@pytest.mark.parametrize(("bundle", "vocab", "lengths"), [
    (TINY_BUNDLE, 384, (3, 20, 41, 77, 5, 130)),
    # gemma4-tiny: sliding window 32 on half its layers; prompts past it
    (GEMMA4_TINY, 512, (5, 40, 77)),
], ids=["tiny", "gemma4-tiny"])
def test_batched_greedy_equals_alone(bundle: Path, vocab: int, lengths: tuple[int, ...]) -> None:
    prompts = _prompts(vocab, lengths)
    want = _alone(bundle, prompts)
    with InferenceContext(bundle, parallel=len(prompts)) as ctx:
        streams = [_open(ctx) for _ in prompts]
        got = _together(streams, [lambda s, p=p: _run(s, p) for p in prompts])
        stats = streams[0].session.engine.stats  # type: ignore[attr-defined]
        for stream in streams:
            assert stream.session.capabilities.batched
            stream.close()
        steps = ctx.batch_stats()  # the scheduler's totals, as /health shows them
    assert got == want
    assert steps is not None and steps.steps > 0 and steps.mean_batch > 1, steps
    # it really batched: most decode steps carried more than one row
    assert stats.widest == len(prompts)
    assert stats.rows >= 2 * stats.batched_steps, stats


def test_capability_says_what_was_opened() -> None:
    with InferenceContext(TINY_BUNDLE) as ctx, _open(ctx) as plain:
        assert not plain.session.capabilities.batched
    with InferenceContext(TINY_BUNDLE, parallel=2) as ctx:
        with _open(ctx) as batched:
            assert batched.session.capabilities.batched
        # a speculative session is not batched (verify rounds are not): an ordinary one
        with _open(ctx, drafter="ngram") as spec:
            assert not spec.session.capabilities.batched
            assert "ngram" in spec.session.capabilities.drafters


def test_a_context_has_parallel_sequences() -> None:
    """As on llama.cpp: ``parallel`` sessions at once; one more is refused until one closes,
    and the row it frees serves a new session exactly."""
    prompt = _prompts(384, (9,))[0]
    want = _alone(TINY_BUNDLE, [prompt])[0]
    with InferenceContext(TINY_BUNDLE, parallel=2) as ctx:
        first, second = _open(ctx), _open(ctx)
        with pytest.raises(SessionBusyError, match="all 2 sequences"):
            _open(ctx)
        assert _run(first, prompt) == want
        first.close()
        with _open(ctx) as third:
            assert _run(third, prompt) == want
        second.close()


# ------------------------------------------------------------------------------ per sequence


def test_cancel_one_sequence_disturbs_no_other() -> None:
    prompts = _prompts(384, (7, 30, 12, 50))
    want = _alone(TINY_BUNDLE, prompts, max_tokens=60)
    victim = 1
    with InferenceContext(TINY_BUNDLE, parallel=4) as ctx:
        streams = [_open(ctx, max_tokens=60) for _ in prompts]
        seen = threading.Event()

        def job(i: int) -> Callable[[Stream], Any]:
            def run(stream: Stream) -> Any:
                stream.prefill(prompts[i])
                out: list[int] = []
                try:
                    for step in stream:
                        out.extend(step.tokens)
                        if i == victim and len(out) == 10:
                            seen.set()
                            threading.Thread(target=stream.cancel).start()
                except CancelledError:
                    return ("cancelled", out)
                return out
            return run

        got = _together(streams, [job(i) for i in range(len(prompts))])
        assert seen.is_set()
        status, partial = got[victim]
        assert status == "cancelled"
        assert partial == want[victim][:len(partial)]
        for i in range(len(prompts)):
            if i != victim:
                assert got[i] == want[i], i
        # the cancelled row serves again after a reset, exactly
        streams[victim].reset()
        assert _run(streams[victim], prompts[victim]) == want[victim]
        for stream in streams:
            stream.close()


def test_reset_keep_and_next_turn_per_sequence() -> None:
    """Rewinds and a second turn on one row while the others decode: each equals what the same
    calls give on an ordinary session."""
    a, b, more = _prompts(384, (15, 22, 6))

    def script(stream: Stream) -> list[list[int]]:
        first = _run(stream, a)
        kept = stream.reset_keep(len(a) + 5)  # keep the prompt and 5 generated tokens
        assert kept == len(a) + 5
        again = _run(stream, more)
        stream.reset_keep(len(a))
        replay = _run(stream, more)
        stream.reset()
        return [first, again, replay, _run(stream, a)]

    with InferenceContext(TINY_BUNDLE) as ctx:
        with _open(ctx) as plain:
            want = script(plain)
        with _open(ctx, max_tokens=80) as plain:
            want_b = _run(plain, b)
    with InferenceContext(TINY_BUNDLE, parallel=2) as ctx:
        s1, s2 = _open(ctx), _open(ctx, max_tokens=80)
        got, got_b = _together([s1, s2], [script, lambda s: _run(s, b)])
        s1.close()
        s2.close()
    assert got == want
    assert got[3] == got[0]
    assert got_b == want_b


def test_seeded_sampling_does_not_depend_on_batch_mates() -> None:
    """A sampled row draws from its own seeded generator: the same tokens alone on the engine
    as beside three other rows (and a different seed gives different ones)."""
    prompts = _prompts(384, (10, 10, 30, 44))
    cfg = {"temperature": 0.9, "top_k": 40, "seed": 7}
    with InferenceContext(TINY_BUNDLE, parallel=4) as ctx, _open(ctx, **cfg) as solo:
        assert solo.session.capabilities.batched
        alone = _run(solo, prompts[0])
        solo.reset()
        assert _run(solo, prompts[0]) == alone
    with InferenceContext(TINY_BUNDLE, parallel=4) as ctx:
        seeds = [7, 8, 7, 7]
        streams = [_open(ctx, **{**cfg, "seed": seed}) for seed in seeds]
        same = [prompts[0], prompts[0], prompts[2], prompts[3]]
        got = _together(streams, [lambda s, p=p: _run(s, p) for p in same])
        for stream in streams:
            stream.close()
    assert got[0] == alone
    assert got[1] != alone


def test_logits_hook_runs_per_row() -> None:
    """A constrained row and a logprobs row beside a plain one: each equals the same session on
    an ordinary context (the hook masks and records only its own row)."""
    prompts = _prompts(384, (12, 12, 20))
    cfgs: list[dict[str, Any]] = [{"regex": "[a-z ]+", "ignore_eos": False},
                                  {"logprobs": True, "top_logprobs": 2},
                                  {}]

    def collect(stream: Stream, prompt: list[int]) -> tuple[list[int], str, list[Any]]:
        stream.prefill(prompt)
        steps = list(stream)
        return ([t for s in steps for t in s.tokens], "".join(s.text for s in steps),
                [s.logprobs for s in steps])

    want = []
    with InferenceContext(TINY_BUNDLE) as ctx:
        for prompt, cfg in zip(prompts, cfgs, strict=True):
            with _open(ctx, **cfg) as stream:
                want.append(collect(stream, prompt))
    with InferenceContext(TINY_BUNDLE, parallel=3) as ctx:
        streams = [_open(ctx, **cfg) for cfg in cfgs]
        got = _together(streams, [lambda s, p=p: collect(s, p) for p in prompts])
        for stream in streams:
            stream.close()
    assert [g[0] for g in got] == [w[0] for w in want]
    assert [g[1] for g in got] == [w[1] for w in want]
    assert got[0][1] and all(c in "abcdefghijklmnopqrstuvwxyz " for c in got[0][1])
    for got_step, want_step in zip(got[1][2], want[1][2], strict=True):
        assert got_step is not None and want_step is not None
        for g, w in zip(got_step, want_step, strict=True):
            assert g.token == w.token
            assert g.logprob == pytest.approx(w.logprob, abs=1e-4)


def test_cancel_during_a_chunked_prefill_disturbs_no_other() -> None:
    """A long prompt (16-token chunks) cancelled between its chunks while two rows decode: the
    decoders equal their alone runs, the cancelled row's partial chunks are trimmed off (a
    reset and a new prompt serve exactly)."""
    long_prompt, *short = _prompts(384, (300, 8, 21))
    want = _alone(TINY_BUNDLE, short, max_tokens=60)
    with InferenceContext(TINY_BUNDLE, parallel=3) as ctx:
        victim = _open(ctx, batch_size=16)
        others = [_open(ctx, max_tokens=60) for _ in short]
        engine = victim.session.engine  # type: ignore[attr-defined]

        def prefill_long(stream: Stream) -> str:
            try:
                stream.prefill(long_prompt)
            except CancelledError:
                return "cancelled"
            return "finished"

        def canceller() -> None:
            while engine.stats.solo_chunks < 3:
                threading.Event().wait(0.001)
            victim.cancel()

        threading.Thread(target=canceller, daemon=True).start()
        got = _together([victim, *others],
                        [prefill_long, *[lambda s, p=p: _run(s, p) for p in short]])
        assert got[0] == "cancelled"
        assert got[1:] == want
        assert victim.session.n_past == 0
        victim.reset()
        assert _run(victim, short[0]) == want[0][:N_TOKENS]
        for stream in [victim, *others]:
            stream.close()
