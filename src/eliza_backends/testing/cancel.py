"""The kit's cancel area: ``cancel()`` from another thread before and during a prefill or a
decode, sticky until a reset; one consumer per session (``SessionBusyError``).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from ..backend.session import Session
from ..errors import CancelledError, SessionBusyError
from .fixtures import KitFixtures
from .helpers import generated_tokens, long_prompt, run_to_end


class CancelChecks(KitFixtures):
    """cancel() from another thread, before and during calls; one consumer per session."""

    def test_cancel_before_call(self, session: Session, prompt: list[int]) -> None:
        t = threading.Thread(target=session.cancel)
        t.start()
        t.join()
        with pytest.raises(CancelledError):
            session.prefill(prompt)
        with pytest.raises(CancelledError):
            session.next()
        session.reset()
        session.prefill(prompt)
        assert session.next().tokens

    def test_cancel_during_prefill(self, open_session: Any) -> None:
        """cancel() from another thread a fifth of the way into a long prefill stops it with
        CancelledError at the next chunk: a prefill that runs on to the end fails."""
        with open_session(context_size=4096, batch_size=16) as s:
            if not s.capabilities.cancel_prefill:
                pytest.skip("capabilities.cancel_prefill is False")
            ids = long_prompt(s, s.context_size - 8, self.prompt_text)
            self._cancel_mid_call(s, lambda: s.prefill(ids), "prefill")
            s.reset()
            s.prefill(ids[:20])
            assert s.next().tokens

    def test_cancel_during_decode(self, open_session: Any, prompt: list[int]) -> None:
        """The same for one long ``next()``: it stops at the next token."""
        with open_session(context_size=4096, max_tokens=1500, ignore_eos=True,
                          tokens_per_step=1500) as s:
            def decode() -> None:
                s.reset()
                s.prefill(prompt)
                s.next()

            self._cancel_mid_call(s, decode, "next")
            s.reset()
            s.prefill(prompt)
            assert s.next().tokens

    @staticmethod
    def _cancel_mid_call(s: Session, call: Any, what: str) -> None:
        """Time ``call`` uncancelled, then run it again with cancel() fired a fifth of the
        way in: it must raise CancelledError soon after the cancel (within a quarter of the
        call's time: a chunk or a token, with room for a busy machine). It may finish only
        when it beat the timer."""
        t0 = time.perf_counter()
        call()
        full = time.perf_counter() - t0
        s.reset()
        fired: list[float] = []

        def cancel() -> None:
            fired.append(time.perf_counter())
            s.cancel()

        timer = threading.Timer(full / 5, cancel)
        timer.start()
        try:
            call()
            outcome = "finished"
        except CancelledError:
            outcome = "cancelled"
        returned = time.perf_counter()
        timer.join()
        late = returned - fired[0]
        assert late < full / 4 + 0.05, (
            f"{what}() ran {late:.3f}s past cancel() ({outcome}; the whole call takes "
            f"{full:.3f}s): the session does not check _raise_if_cancelled() inside the call")
        if outcome == "finished":  # it beat the timer: the next call must see the cancel
            with pytest.raises(CancelledError):
                s.next()

    def test_cancel_keeps_history_for_reset_keep(self, open_session: Any,
                                                 prompt: list[int]) -> None:
        with open_session() as fresh:
            fresh.prefill(prompt)
            expected = generated_tokens(run_to_end(fresh))
        with open_session() as s:
            s.prefill(prompt)
            s.cancel()
            with pytest.raises(CancelledError):
                s.next()
            kept = s.reset_keep(len(prompt) - 1)
            assert kept in (len(prompt) - 1, 0)
            s.prefill(prompt[kept:])
            assert generated_tokens(run_to_end(s)) == expected

    def test_second_thread_gets_busy_error(self, open_session: Any) -> None:
        with open_session(context_size=4096, batch_size=16) as s:
            ids = long_prompt(s, s.context_size - 8, self.prompt_text)
            errors: list[BaseException] = []

            def consumer() -> None:
                try:
                    s.prefill(ids)
                except CancelledError:
                    pass
                except BaseException as exc:  # pragma: no cover - reported below
                    errors.append(exc)

            t = threading.Thread(target=consumer)
            t.start()
            deadline = time.monotonic() + 10
            while not s.busy and t.is_alive() and time.monotonic() < deadline:
                time.sleep(0.0005)
            if not t.is_alive():
                pytest.skip("prefill finished before a second thread could collide with it")
            with pytest.raises(SessionBusyError):
                s.next()
            s.cancel()
            t.join()
            assert not errors


__all__ = ["CancelChecks"]
