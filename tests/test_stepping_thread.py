"""A step scheduler with a thread of its own (issue 39): every step runs on that thread, a job
it adopts (a stream's loop of ``next`` calls) decodes with no hop between threads, other
submitters' shares ride along in the job's steps, and an interrupted submitter abandons its
share without its callback ever running behind its back. On llama.cpp: every ``llama_decode``
of a batched context is made by its stepping thread, and an adopted stream's reply is the one a
stream on another thread gets."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Sequence

import pytest
from conftest import TINY_BUNDLE

from eliza_backends.backend import Piece, StepScheduler


def _stepping(decode_log: list[tuple[int, list[int]]], hold: threading.Event | None = None,
              **kwargs: float) -> StepScheduler:
    """A scheduler with a stepping thread whose decode logs (thread id, sequences) per step
    and, with ``hold``, waits for it in the first step."""

    def decode(pieces: Sequence[Piece]) -> None:
        decode_log.append((threading.get_ident(), [p.seq for p in pieces]))
        if hold is not None and len(decode_log) == 1:
            hold.wait(10)

    return StepScheduler(decode, 64, stepping_thread="test-steps", **kwargs)


def test_every_step_runs_on_the_stepping_thread_and_close_joins_it() -> None:
    log: list[tuple[int, list[int]]] = []
    sched = _stepping(log, gather_window=0.0)
    ran_on: list[int] = []
    for pos in range(3):
        sched.submit(0, [pos], pos, 1, lambda piece: ran_on.append(threading.get_ident()))
    stepper = {tid for tid, _ in log}
    assert len(stepper) == 1 and threading.get_ident() not in stepper
    assert set(ran_on) == stepper  # the callbacks too: they read the decode's outputs
    threads = {t.ident: t for t in threading.enumerate()}
    thread = threads[stepper.pop()]
    assert thread.name == "test-steps"
    sched.close()
    assert not thread.is_alive()


def test_an_adopted_job_leads_its_own_steps_and_others_ride_along() -> None:
    """The job's shares decode on the stepping thread with no other thread involved; a share
    another thread queued meanwhile shares the job's next step; one job at a time."""
    log: list[tuple[int, list[int]]] = []
    sched = _stepping(log, gather_window=1.0)
    arrive = threading.Event()
    second_adopt: list[object] = []

    def job() -> list[int]:
        tokens = []
        for pos in range(4):
            if pos == 2:  # another stream arrives: wait until its share is queued
                arrive.set()
                while sched.queued < 1:
                    time.sleep(0.001)
            tokens.append(sched.submit(0, [pos], pos, 1, lambda piece: piece.start))
        second_adopt.append(sched.adopt(lambda: None))
        return tokens

    def other_stream() -> None:
        arrive.wait(10)
        sched.submit(1, [9], 0, 1, lambda piece: None)

    other = threading.Thread(target=other_stream, daemon=True)
    other.start()
    future = sched.adopt(job)
    assert future is not None
    assert future.result(10) == [0, 1, 2, 3]
    other.join(10)
    assert second_adopt == [None]  # (while the job ran)
    assert len({tid for tid, _ in log}) == 1
    assert [seqs for _, seqs in log] == [[0], [0], [1, 0], [0]]  # (arrival order)
    assert sched.adopt(lambda: None) is not None  # free again once the job ended
    sched.close()
    assert sched.adopt(lambda: None) is None  # closed


def test_a_scheduler_without_a_thread_adopts_nothing() -> None:
    sched = StepScheduler(lambda pieces: None, 8)
    assert sched.adopt(lambda: None) is None


def test_an_interrupted_submitter_abandons_its_share() -> None:
    """A KeyboardInterrupt while the main thread waits for its share: the share is dropped at
    the next step boundary, its callback never runs, and the interrupt reaches the caller once
    the scheduler no longer holds the share."""
    log: list[tuple[int, list[int]]] = []
    hold = threading.Event()
    sched = _stepping(log, hold, gather_window=0.0)
    busy = threading.Thread(target=lambda: sched.submit(1, [5], 0, 1, lambda piece: None),
                            daemon=True)
    busy.start()
    while not log:  # the first step (sequence 1) decodes and waits for `hold`
        time.sleep(0.001)
    ran: list[Piece] = []

    main = threading.get_ident()

    def interrupt_then_release() -> None:
        while sched.queued < 2:
            time.sleep(0.001)
        signal.pthread_kill(main, signal.SIGINT)  # (interrupts the main thread's wait)
        time.sleep(0.2)
        hold.set()

    helper = threading.Thread(target=interrupt_then_release, daemon=True)
    helper.start()
    with pytest.raises(KeyboardInterrupt):
        sched.submit(0, [7], 0, 1, ran.append)
    assert sched.queued == 0 and ran == []
    busy.join(10)
    helper.join(10)
    assert [seqs for _, seqs in log] == [[1]]
    sched.close()


def test_llama_cpp_decodes_every_step_on_the_stepping_thread() -> None:
    """On a batched llama.cpp context every ``llama_decode`` comes from the engine's stepping
    thread, and a stream whose loop runs there (adopted) gives the reply a stream driven from
    another thread gives."""
    pytest.importorskip("llama_cpp")
    import eliza_llamacpp.batch_engine as batch_engine

    from eliza_backends import InferenceContext, open_stream
    from eliza_backends.testing import generated_tokens, run_to_end

    callers: set[str] = set()
    real = batch_engine.lc.llama_decode

    def decode(ctx: object, batch: object) -> int:
        callers.add(threading.current_thread().name)
        return int(real(ctx, batch))

    config = {"context_size": 256, "batch_size": 64, "threads": 1, "ignore_eos": True,
              "max_tokens": 12}
    batch_engine.lc.llama_decode = decode
    try:
        with InferenceContext(TINY_BUNDLE, parallel=2) as ctx, \
                open_stream(ctx, backend="llama.cpp", **config) as stream:
            prompt = stream.session.tokenize("Once upon a time", add_special=True)
            stream.session.prefill(prompt)
            direct = generated_tokens(run_to_end(stream.session))
            stream.reset()
            stream.session.prefill(prompt)
            scheduler = stream.session.scheduler
            assert scheduler is not None
            adopted = scheduler.adopt(lambda: generated_tokens(run_to_end(stream.session)))
            assert adopted is not None
            assert adopted.result(60) == direct
    finally:
        batch_engine.lc.llama_decode = real
    assert callers == {"eliza-llamacpp-steps"}
