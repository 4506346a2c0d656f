"""Continuous batching on llama.cpp (issue 31): sessions sharing one ``llama_context`` through
:class:`~eliza_backends.runtime.batching.StepScheduler`, on the tiny bundle and gemma4-tiny.

Every batched stream's greedy output equals the same request served alone; the scheduler's step
records prove the sequences were decoded together; cancels, failures, rewinds and slots of one
sequence leave the others' outputs unchanged; a shared prompt prefix is copied, not decoded; the
conformance kit passes on a ``parallel=4`` context; closing the context under running streams
ends them without a hang.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, TINY_BUNDLE

pytest.importorskip("llama_cpp")

from eliza_llamacpp import LlamaCppFactory

from eliza_backends import (
    BackendRuntimeError,
    CancelledError,
    Factory,
    InferenceContext,
    SessionBusyError,
    SessionClosedError,
    StreamConfig,
    UnsupportedOperationError,
)
from eliza_backends.backend import Piece, Session, StepScheduler
from eliza_backends.testing import BackendConformance, generated_tokens, run_to_end

GEMMA4_TINY = ROOT / "examples" / "bundles" / "gemma4-tiny"
BUNDLES = {"tiny": TINY_BUNDLE, "gemma4-tiny": GEMMA4_TINY}
#: Steps shared by several sequences (the opt-in mode this file checks; the default, one
#: sequence per step, is tests/test_batch_invariance.py's).
BASE = {"context_size": 256, "batch_size": 64, "threads": 1, "ignore_eos": True,
        "options": {"llama.cpp": {"batch_invariant": False}}}


def _prompts(bundle: Path) -> list[list[int]]:
    oracle = json.loads((bundle / "oracle.json").read_text())
    return [case["prompt_ids"] for case in oracle["prompts"]]


def _open(ctx: InferenceContext, **overrides: Any) -> Session:
    with ctx.opening():
        return LlamaCppFactory().open(ctx, StreamConfig.build({**BASE, **overrides}))


def _scheduler(session: Session) -> StepScheduler:
    sched = session.scheduler  # type: ignore[attr-defined]
    assert isinstance(sched, StepScheduler)
    return sched


def _generate(session: Session, prompt: list[int]) -> list[int]:
    session.prefill(prompt)
    return generated_tokens(run_to_end(session))


def _solo(bundle: Path, prompt: list[int], **overrides: Any) -> list[int]:
    with InferenceContext(bundle) as ctx, _open(ctx, **overrides) as s:
        assert not s.capabilities.batched
        return _generate(s, prompt)


def _threads(fns: list[Callable[[], Any]], timeout: float = 300.0
             ) -> tuple[list[Any], list[BaseException | None]]:
    """Run each function on its own thread; their results and exceptions."""
    results: list[Any] = [None] * len(fns)
    errors: list[BaseException | None] = [None] * len(fns)

    def run(i: int) -> None:
        try:
            results[i] = fns[i]()
        except BaseException as exc:
            errors[i] = exc

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(fns))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "a stream hung"
    return results, errors


def _stream(ctx: InferenceContext, prompt: list[int], together: threading.Barrier | None = None,
            **overrides: Any) -> Callable[[], Any]:
    """A stream on its own thread; with ``together``, it starts decoding once every stream of
    the barrier has prefilled (so they overlap however late their threads start)."""
    def run() -> list[int]:
        with _open(ctx, **overrides) as s:
            s.prefill(prompt)
            if together is not None:
                together.wait(timeout=60)
            return generated_tokens(run_to_end(s))

    return run


@pytest.mark.parametrize("name", ["tiny", "gemma4-tiny"])
def test_concurrent_greedy_streams_equal_each_served_alone(name: str) -> None:
    bundle = BUNDLES[name]
    prompts = _prompts(bundle)[:6]
    n = 24
    alone = [_solo(bundle, p, max_tokens=n) for p in prompts]
    with InferenceContext(bundle, parallel=6) as ctx:
        with _open(ctx, max_tokens=n) as probe:
            assert probe.capabilities.batched
            sched = _scheduler(probe)
        together = threading.Barrier(len(prompts))
        results, errors = _threads([_stream(ctx, p, together, max_tokens=n) for p in prompts])
        assert errors == [None] * len(prompts)
        assert results == alone
        stats = sched.stats()
        assert ctx.batch_stats() == stats  # (the context's one batched runtime context)
    assert stats.shares >= len(prompts) * n and stats.failed == 0
    assert stats.mean_batch > 1.5, stats.batch_sizes  # decoded together


def test_four_greedy_streams_mostly_share_steps() -> None:
    """The fragmentation trap: with 4 streams decoding, steps do not alternate batches of 1
    and 3: the leader waits for every sequence of the last step to come back. The tiny model's
    steps take ~0.3 ms, so on a loaded machine the OS can hold a thread back longer than the
    10 ms window (it then rejoins a step later); the window is widened here to what such a
    hold-up takes, so the check is about the gathering rule, not the machine's load
    (benchmarks/bench_batching.py measures the default window on a real model). A thread the
    OS holds back past the barrier is not waited for (no step of it ran yet: nobody expects
    it), so it joins some steps late and ends as many steps after the others (seen in CI under
    load: the first steps carried 3, 49 of 77 carried 4); the rule is checked over the steps
    between the first and the last that carried all four, where fragmentation would show."""
    prompts = _prompts(TINY_BUNDLE)[:4]
    with InferenceContext(TINY_BUNDLE, parallel=4) as ctx:
        with _open(ctx) as probe:
            sched = _scheduler(probe)
        sched.gather_window = 0.5
        together = threading.Barrier(4)
        _, errors = _threads([_stream(ctx, p, together, max_tokens=64) for p in prompts])
        assert errors == [None] * 4
        records = list(sched.records)
    decode_steps = [r.sequences for r in records if r.prefill_tokens == 0]
    full = [i for i, n in enumerate(decode_steps) if n == 4]
    assert full, decode_steps
    together_steps = decode_steps[full[0]:full[-1] + 1]
    assert len(together_steps) >= 16, decode_steps  # a quarter of the 63 decode steps at least
    assert len(full) > 0.9 * len(together_steps), decode_steps


def test_long_prefill_rides_along_with_running_decodes() -> None:
    """Mixed lengths, a long prompt arriving while the others decode: it goes in pieces of the
    batch, decodes first, and every stream still equals its solo run."""
    prompts = _prompts(TINY_BUNDLE)[:3]
    long_prompt = [t for p in _prompts(TINY_BUNDLE)[3:] for t in p][:150]
    cfg = {"batch_size": 16, "context_size": 256}
    alone = [_solo(TINY_BUNDLE, p, max_tokens=40, **cfg) for p in prompts]
    late_alone = _solo(TINY_BUNDLE, long_prompt, max_tokens=20, **cfg)
    with InferenceContext(TINY_BUNDLE, parallel=4) as ctx:
        sessions = [_open(ctx, max_tokens=40, **cfg) for _ in prompts]
        late = _open(ctx, max_tokens=20, **cfg)
        sched = _scheduler(late)
        started = threading.Barrier(len(prompts) + 1)

        def early(s: Session, p: list[int]) -> Callable[[], list[int]]:
            def run() -> list[int]:
                s.prefill(p)
                out = list(s.next(5).tokens)
                started.wait(timeout=60)  # the late prompt arrives while these decode
                return out + generated_tokens(run_to_end(s))
            return run

        def arrive_late() -> list[int]:
            started.wait(timeout=60)
            return _generate(late, long_prompt)

        results, errors = _threads([*(early(s, p) for s, p in zip(sessions, prompts,
                                                                   strict=True)),
                                    arrive_late])
        assert errors == [None] * 4
        assert results == [*alone, late_alone]
        records = list(sched.records)
        for s in [*sessions, late]:
            s.close()
    assert all(r.tokens <= 16 for r in records)
    mixed = [r for r in records if r.prefill_tokens and r.decodes]
    assert len(mixed) >= 3, "the long prefill went in pieces alongside the decodes"


def test_cancel_one_stream_ends_it_within_a_step_and_leaves_the_others() -> None:
    prompts = _prompts(TINY_BUNDLE)[:4]
    n = 120
    alone = [_solo(TINY_BUNDLE, p, max_tokens=n) for i, p in enumerate(prompts) if i != 1]
    with InferenceContext(TINY_BUNDLE, parallel=4) as ctx:
        victim = _open(ctx, max_tokens=n)
        sched = _scheduler(victim)
        at: dict[str, int] = {}
        together = threading.Barrier(4)
        decoding = threading.Event()

        def cancelled_stream() -> None:
            victim.prefill(prompts[1])
            together.wait(timeout=60)
            at["start"] = sched.stats().steps
            decoding.set()
            try:
                victim.next(n)  # one call: the cancel lands inside it
            except CancelledError:
                at["ended"] = sched.stats().steps
                raise

        def canceller() -> None:
            decoding.wait(timeout=60)
            while sched.stats().steps < at["start"] + 20:
                time.sleep(0.0005)
            at["cancel"] = sched.stats().steps
            victim.cancel()

        others = [_stream(ctx, p, together, max_tokens=n)
                  for i, p in enumerate(prompts) if i != 1]
        results, errors = _threads([cancelled_stream, canceller, *others])
        assert isinstance(errors[0], CancelledError)
        assert errors[1:] == [None] * 4
        assert results[2:] == alone
        assert at["ended"] - at["cancel"] <= 2, at  # the step in flight, then dropped
        assert victim.history == tuple(prompts[1])  # the cancelled step had no effect
        victim.reset()  # the sequence is usable again
        assert _generate(victim, prompts[1])[:5] == _solo(TINY_BUNDLE, prompts[1],
                                                           max_tokens=5)
        victim.close()


def test_a_failing_share_fails_alone() -> None:
    """A share whose callback raises (here the sampler of one sequence) fails that stream's
    step only; the step has no effect, and the stream continues as if it never happened."""
    prompts = _prompts(TINY_BUNDLE)[:4]
    n = 30
    alone = [_solo(TINY_BUNDLE, p, max_tokens=n) for p in prompts]
    with InferenceContext(TINY_BUNDLE, parallel=4) as ctx:
        faulty = _open(ctx, max_tokens=n)
        real_pick = faulty._pick  # type: ignore[attr-defined]
        calls = {"n": 0}

        def pick(i: int) -> int:
            calls["n"] += 1
            if calls["n"] == 8:
                raise BackendRuntimeError("injected sampler failure")
            return int(real_pick(i))

        faulty._pick = pick  # type: ignore[attr-defined]

        together = threading.Barrier(4)

        def failing() -> list[int]:
            faulty.prefill(prompts[0])
            together.wait(timeout=60)
            got: list[int] = []
            while True:
                try:
                    step = faulty.next()
                except BackendRuntimeError:
                    got.append(-1)  # marks the failed step
                    continue
                got.extend(step.tokens)
                if step.final:
                    return got

        others = [_stream(ctx, p, together, max_tokens=n) for p in prompts[1:]]
        results, errors = _threads([failing, *others])
        assert errors == [None] * 4
        assert -1 in results[0]
        assert [t for t in results[0] if t != -1] == alone[0]
        assert results[1:] == alone[1:]
        assert _scheduler(faulty).stats().failed == 1
        faulty.close()


def test_rewinds_and_slots_of_one_sequence_leave_the_other_intact(tmp_path: Path) -> None:
    p1, p2, extra = _prompts(TINY_BUNDLE)[:3]
    n = 12
    b_alone = _solo(TINY_BUNDLE, p2, max_tokens=4 * n)
    a_after_keep = _solo(TINY_BUNDLE, p1[:5] + extra, max_tokens=n)
    with InferenceContext(TINY_BUNDLE, parallel=2) as ctx:
        a, b = _open(ctx, max_tokens=n), _open(ctx, max_tokens=4 * n)
        b.prefill(p2)
        got_b = list(b.next(n).tokens)
        a.prefill(p1)
        a.next(n)
        assert a.reset_keep(5) == 5
        got_b += b.next(n).tokens
        a.prefill(extra)
        assert generated_tokens(run_to_end(a)) == a_after_keep
        a.save_slot(tmp_path / "a.slot")
        a.reset()
        got_b += b.next(n).tokens
        a.restore_slot(tmp_path / "a.slot")
        got_b += b.next(n).tokens
        assert a.history[-n:] == tuple(a_after_keep)
        assert got_b == b_alone
        # a slot of a batched sequence restores into an own context
        with InferenceContext(TINY_BUNDLE) as own, _open(own, max_tokens=n) as c:
            c.restore_slot(tmp_path / "a.slot")
            c.reset_keep(len(p1[:5] + extra))
            c.prefill(extra[:3])
            cont = generated_tokens(run_to_end(c))
        assert cont == _solo(TINY_BUNDLE, p1[:5] + extra + extra[:3], max_tokens=n)
        a.close()
        b.close()


def test_a_shared_prefix_is_copied_not_decoded() -> None:
    prompts = _prompts(TINY_BUNDLE)
    header = [t for p in prompts[:4] for t in p][:60]  # a shared "system prompt"
    first, second = header + prompts[5], header + prompts[6]
    n = 16
    alone = [_solo(TINY_BUNDLE, p, max_tokens=n) for p in (first, second)]
    with InferenceContext(TINY_BUNDLE, parallel=4) as ctx:
        a, b = _open(ctx, max_tokens=n), _open(ctx, max_tokens=n)
        engine = a._lane.engine  # type: ignore[attr-defined]
        before = engine.decoded
        got_a = _generate(a, first)
        after_a = engine.decoded
        got_b = _generate(b, second)
        after_b = engine.decoded
        assert [got_a, got_b] == alone
        shared = _common(first, second)
        assert shared >= len(header)
        # a decoded its whole prompt; b only what follows the shared prefix (plus its tokens)
        assert after_a - before == len(first) + n - 1
        assert after_b - after_a == len(second) - shared + n - 1
        assert engine.prefill_copied == shared
        # a prefix held by a closed sequence is gone with it: c copies from b, still live
        a.close()
        with _open(ctx, max_tokens=n) as c:
            assert _generate(c, first) == alone[0]
        assert engine.prefill_copied == 2 * shared
        b.close()


def test_a_state_loaded_into_the_source_of_a_prefix_copy_does_not_reach_the_copy(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Across per-sequence caches llama.cpp copies a cache at the next ``llama_decode``, not at
    ``llama_memory_seq_cp``. A state loaded into the source in between (the prompt cache
    restoring another conversation into that slot, on another request's thread) must not be
    what the copy gets: the load is refused until that decode, a save of the copy fails, and
    the copying sequence replies as it does alone. The interleaving is made certain by trying
    both right after the copy, where that thread may come."""
    prompts = _prompts(TINY_BUNDLE)
    header = [t for p in prompts[:4] for t in p][:60]
    first, second, other = header + prompts[5], header + prompts[6], prompts[12]
    n = 16
    alone = _solo(TINY_BUNDLE, second, max_tokens=n)
    with InferenceContext(TINY_BUNDLE, parallel=2) as ctx:
        a, b = _open(ctx, max_tokens=n), _open(ctx, max_tokens=n)
        lane = a._lane  # type: ignore[attr-defined]
        a.prefill(other)
        other_state = lane.save()
        a.reset()
        a.prefill(first)
        engine = lane.engine
        share_prefix = engine.share_prefix
        tried: list[tuple[bool, bytes]] = []

        def share_then_load(seq: int, tokens: Sequence[int], start: int) -> int:
            new_start = share_prefix(seq, tokens, start)
            assert new_start >= len(header)  # copied from a
            tried.append((lane.load(other_state, other), b._lane.save()))  # type: ignore[attr-defined]
            return int(new_start)

        monkeypatch.setattr(engine, "share_prefix", share_then_load)
        assert _generate(b, second) == alone
        assert tried == [(False, b"")]
        assert lane.load(other_state, other)  # the copy is made: loads are taken again
        assert engine.pending_copies == []
        a.close()
        b.close()


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_all_sequences_in_use_is_a_typed_error() -> None:
    with InferenceContext(TINY_BUNDLE, parallel=2) as ctx:
        a, b = _open(ctx), _open(ctx)
        with pytest.raises(SessionBusyError, match="close a stream first"):
            _open(ctx)
        a.close()
        with _open(ctx) as c:
            assert c.capabilities.batched
        b.close()


def test_a_new_stream_takes_the_lowest_free_sequence() -> None:
    """So the live sequence ids stay one run: llama.cpp decodes a step over per-sequence KV
    caches in one pass per run of consecutive ids (eliza_llamacpp.batch_engine)."""
    with InferenceContext(TINY_BUNDLE, parallel=4) as ctx:
        sessions = [_open(ctx) for _ in range(4)]
        assert [s._lane.seq for s in sessions] == [0, 1, 2, 3]  # type: ignore[attr-defined]
        sessions[2].close()
        sessions[0].close()
        with _open(ctx) as again:
            assert again._lane.seq == 0  # type: ignore[attr-defined]
            with _open(ctx) as then:
                assert then._lane.seq == 2  # type: ignore[attr-defined]
        for s in sessions:
            s.close()


@pytest.mark.parametrize(("by_sequence", "expected"),
                         [(True, [0, 1, 2, 3]), (False, [3, 1, 2, 0])])
def test_rows_by_sequence_lays_a_step_out_in_id_order(by_sequence: bool,
                                                      expected: list[int]) -> None:
    """Shares queued in the order 3, 1, 2, 0 decode in one step with rows 0..3 in id order, and
    each callback reads its own row; without the option the rows keep the arrival order."""
    steps: list[list[Piece]] = []
    release = threading.Event()

    def decode(pieces: Sequence[Piece]) -> None:
        steps.append(list(pieces))
        if len(steps) == 1:  # the first step holds the leader until the others queue
            release.wait(10)

    sched = StepScheduler(decode, 16, gather_window=0.0, rows_by_sequence=by_sequence)
    rows: dict[int, int] = {}

    def submit(seq: int) -> None:
        rows[seq] = sched.submit(seq, [seq], 5, 1, lambda piece: piece.last_row)

    threads = [threading.Thread(target=submit, args=(9,), daemon=True)]
    threads[0].start()
    while not steps:
        time.sleep(0.001)
    for seq in (3, 1, 2, 0):
        threads.append(threading.Thread(target=submit, args=(seq,), daemon=True))
        threads[-1].start()
        while sched.queued < len(threads):
            time.sleep(0.001)
    release.set()
    for t in threads:
        t.join(10)
    assert [[p.seq for p in step] for step in steps] == [[9], expected]
    assert [p.row for p in steps[1]] == [0, 1, 2, 3]
    assert {seq: rows[seq] for seq in expected} == dict(zip(expected, range(4), strict=True))


def test_an_expected_prefill_shares_the_step_of_one_already_queued() -> None:
    """A sequence that said it is about to submit (``expect``: a prompt on its way, its thread
    busy with a call between steps) is waited for like a running one: the queued prefill does
    not start a step of its own, both prompts decode in one step. One that never comes costs
    the gather window once."""
    steps: list[list[int]] = []
    sched = StepScheduler(lambda pieces: steps.append([p.seq for p in pieces]), 64,
                          gather_window=5.0)
    sched.expect(1)
    late = threading.Thread(target=lambda: (time.sleep(0.2), sched.submit(
        1, [7, 8, 9], 0, 1, lambda piece: None)), daemon=True)
    late.start()
    sched.submit(0, [4, 5, 6], 0, 1, lambda piece: None)
    late.join(10)
    assert steps == [[0, 1]]

    sched.gather_window = 0.05
    sched.expect(2)  # never submits
    began = time.perf_counter()
    sched.submit(0, [1], 3, 1, lambda piece: None)
    assert 0.04 <= time.perf_counter() - began < 5.0
    assert steps[-1] == [0] and sched.records[-1].waited_out


def test_calls_between_steps_get_in_before_the_next_step() -> None:
    """A thread blocked entering ``exclusive()`` while a step decodes runs its call before the
    leader's next step, every time (the leader, already running, would otherwise often take
    the native lock again first, and a request's slot save or prefix copy would wait several
    steps)."""
    steps = 0
    waited: list[int] = []

    def decode(pieces: Sequence[Piece]) -> None:
        nonlocal steps
        steps += 1
        time.sleep(0.004)

    sched = StepScheduler(decode, 1, gather_window=1.0)
    leader = threading.Thread(target=lambda: sched.submit(0, list(range(400)), 0, 1,
                                                          lambda piece: None), daemon=True)
    leader.start()
    while steps < 2:
        time.sleep(0.001)
    for _ in range(40):  # each call enters while a step decodes, at any point of it
        before = steps
        with sched.exclusive():
            waited.append(steps - before)
        time.sleep(0.0013)
    leader.join(20)
    assert max(waited) <= 1, waited


def test_batch_stats_count_every_batched_runtime_context_of_a_context() -> None:
    with InferenceContext(TINY_BUNDLE) as plain, _open(plain) as s:
        s.prefill(_prompts(TINY_BUNDLE)[0])
        s.next(4)
        assert plain.batch_stats() is None  # parallel=1: nothing batched
    with InferenceContext(TINY_BUNDLE, parallel=2) as ctx:
        assert ctx.batch_stats() is None  # nothing opened yet
        # two batched runtime contexts on one InferenceContext (other thread counts): summed
        with _open(ctx, threads=1) as a, _open(ctx, threads=2) as b:
            assert _scheduler(a) is not _scheduler(b)
            for s in (a, b):
                s.prefill(_prompts(TINY_BUNDLE)[0])
                s.next(4)
            parts = [_scheduler(a).stats(), _scheduler(b).stats()]
            total = ctx.batch_stats()
    assert total is not None and total.steps == sum(p.steps for p in parts) > 0
    assert total.tokens == sum(p.tokens for p in parts)
    summary = total.summary()
    assert summary["steps"] == total.steps and summary["mean_sequences_per_step"] == 1.0


def test_mtp_drafter_is_refused_on_a_batched_context() -> None:
    with InferenceContext(GEMMA4_TINY, parallel=2) as ctx, \
            pytest.raises(UnsupportedOperationError, match="batched"):
        _open(ctx, drafter="mtp")


def test_drafting_and_sampling_stay_per_sequence() -> None:
    """N-gram drafting and seeded sampling on a shared context give what they give alone."""
    prompts = _prompts(TINY_BUNDLE)[:4]
    n = 32
    kinds: list[dict[str, Any]] = [
        {"drafter": "ngram", "draft_length": 3}, {},
        {"temperature": 0.8, "top_k": 40, "seed": 7},
        {"temperature": 1.0, "seed": 3, "repeat_penalty": 1.1}]
    cases = list(zip(prompts, kinds, strict=True))
    alone = [_solo(TINY_BUNDLE, p, max_tokens=n, **kw) for p, kw in cases]
    with InferenceContext(TINY_BUNDLE, parallel=4) as ctx:
        results, errors = _threads([_stream(ctx, p, max_tokens=n, **kw)
                                    for p, kw in zip(prompts, kinds, strict=True)])
    assert errors == [None] * 4
    assert results == alone


def test_closing_the_context_under_running_streams_never_hangs() -> None:
    prompts = _prompts(TINY_BUNDLE)[:4]
    ctx = InferenceContext(TINY_BUNDLE, parallel=4)
    sessions = [_open(ctx, max_tokens=100_000, context_size=2048) for _ in prompts]
    going = threading.Barrier(len(prompts) + 1)

    def forever(s: Session, p: list[int]) -> Callable[[], None]:
        def run() -> None:
            s.prefill(p)
            s.next()
            going.wait(timeout=60)
            while True:
                s.next()
        return run

    done: list[Any] = []
    closer = threading.Thread(target=lambda: (going.wait(timeout=60), time.sleep(0.05),
                                              ctx.close(), done.append(1)), daemon=True)
    closer.start()
    _, errors = _threads([forever(s, p) for s, p in zip(sessions, prompts, strict=True)],
                         timeout=60)
    closer.join(60)
    assert done == [1]
    assert all(isinstance(e, (CancelledError, SessionClosedError)) for e in errors), errors
    assert all(s.closed for s in sessions)


class TestBatchedConformance(BackendConformance):
    """The whole contract on sessions that share a ``parallel=4`` context."""

    @pytest.fixture
    def factory(self) -> Factory:
        return LlamaCppFactory()

    @pytest.fixture
    def bundle_dir(self) -> Path:
        return TINY_BUNDLE

    @pytest.fixture
    def context(self, bundle_dir: Path) -> Iterator[InferenceContext]:
        ctx = InferenceContext(bundle_dir, parallel=4)
        yield ctx
        ctx.close()
