"""``server.step_feed.StepFeed``: a job's step results from its thread to the event loop, in
order, with the error that ended them; the first result seen off (the job waits until the
reader took it, never longer than ``SEE_OFF_S``); a reader leaving early is reported."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time

import pytest

from eliza_backends.errors import CancelledError
from eliza_backends.server.step_feed import SEE_OFF_S, StepFeed


def _run_job(feed: StepFeed[int], n: int, error: BaseException | None = None,
             marks: list[tuple[str, float]] | None = None) -> threading.Thread:
    """A thread posting 0..n-1 (the last one ``last``, or then ``error``), seeing each off."""
    def job() -> None:
        for i in range(n):
            feed.post(i, None, error is None and i == n - 1)
            if marks is not None:
                marks.append(("posted", time.perf_counter()))
            feed.see_off()
            if marks is not None:
                marks.append(("seen off", time.perf_counter()))
        if error is not None:
            feed.post(None, error, True)
    thread = threading.Thread(target=job)
    thread.start()
    return thread


def test_results_come_in_order_and_the_first_is_seen_off() -> None:
    marks: list[tuple[str, float]] = []

    async def read() -> list[int]:
        feed: StepFeed[int] = StepFeed(lambda: marks.append(("abandoned", 0.0)))
        thread = _run_job(feed, 5, marks=marks)
        got = []
        async for result in feed.results():
            if not got:
                await asyncio.sleep(0.02)  # a slow reader: the job waits, at most SEE_OFF_S
                marks.append(("taken", time.perf_counter()))
            got.append(result)
        thread.join()
        return got

    assert asyncio.run(read()) == [0, 1, 2, 3, 4]
    labels = [label for label, _ in marks]
    assert "abandoned" not in labels
    posted, seen_off = marks[0][1], marks[1][1]
    assert SEE_OFF_S * 0.9 <= seen_off - posted < 0.02  # bounded: it did not wait for the reader
    # later results are not waited for: each see_off after the first returns at once
    later = [b - a for (la, a), (lb, b) in itertools.pairwise(marks[2:])
             if (la, lb) == ("posted", "seen off")]
    assert later and max(later) < SEE_OFF_S


def test_a_reader_that_takes_the_first_result_releases_the_job_at_once() -> None:
    waited: list[float] = []

    async def read() -> None:
        feed: StepFeed[int] = StepFeed(lambda: None)

        def job() -> None:
            feed.post(0, None, False)
            t0 = time.perf_counter()
            feed.see_off()
            waited.append(time.perf_counter() - t0)
            feed.post(1, None, True)

        thread = threading.Thread(target=job)
        thread.start()
        assert [r async for r in feed.results()] == [0, 1]
        thread.join()

    for _ in range(5):
        asyncio.run(read())
    assert min(waited) < SEE_OFF_S  # released by the reader, not the time bound


def test_the_error_that_ended_the_steps_is_raised_after_the_results() -> None:
    async def read() -> list[int]:
        feed: StepFeed[int] = StepFeed(lambda: None)
        thread = _run_job(feed, 2, error=CancelledError("cancelled: the client went away"))
        got = []
        with pytest.raises(CancelledError, match="client went away"):
            async for result in feed.results():
                got.append(result)
        thread.join()
        return got

    assert asyncio.run(read()) == [0, 1]


def test_a_reader_leaving_early_is_reported_and_frees_the_job() -> None:
    abandoned: list[bool] = []

    async def read() -> None:
        feed: StepFeed[int] = StepFeed(lambda: abandoned.append(True))
        thread = _run_job(feed, 3)
        results = feed.results()
        async for _ in results:
            break
        await results.aclose()  # type: ignore[attr-defined]
        thread.join(1)
        assert not thread.is_alive()

    asyncio.run(read())
    assert abandoned == [True]
