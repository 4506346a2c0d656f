"""The kit's slot area: a restored slot continues identically; truncated, empty, garbage,
flipped and missing slot files are refused and change nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ..backend.session import Session
from ..errors import SlotError, UnsupportedOperationError
from .fixtures import KitFixtures
from .helpers import generated_tokens, run_to_end


class SlotChecks(KitFixtures):
    """Slots continue identically; bad slot files are refused and change nothing."""

    def test_slot_round_trip_continues_identically(self, open_session: Any, prompt: list[int],
                                                   tmp_path: Path) -> None:
        slot = tmp_path / "slot.bin"
        with open_session(ignore_eos=True, max_tokens=16) as s:
            if not s.capabilities.slots:
                with pytest.raises(UnsupportedOperationError):
                    s.save_slot(slot)
                pytest.skip("capabilities.slots is False (checked that save raises)")
            s.prefill(prompt)
            s.next(3)
            s.save_slot(slot)
            expected = generated_tokens(run_to_end(s))
        with open_session(ignore_eos=True, max_tokens=16) as other:
            other.restore_slot(slot)
            assert other.n_past == len(prompt) + 3
            got = generated_tokens(run_to_end(other))
        assert got[: len(expected)] == expected

    def test_slot_right_after_prefill(self, open_session: Any, prompt: list[int],
                                      tmp_path: Path) -> None:
        slot = tmp_path / "slot.bin"
        with open_session() as s:
            if not s.capabilities.slots:
                pytest.skip("capabilities.slots is False")
            s.prefill(prompt)
            s.save_slot(slot)
            expected = generated_tokens(run_to_end(s))
            s.reset()
            s.restore_slot(slot)
            assert generated_tokens(run_to_end(s)) == expected

    def test_bad_slot_files_are_refused(self, session: Session, prompt: list[int],
                                        tmp_path: Path) -> None:
        if not session.capabilities.slots:
            pytest.skip("capabilities.slots is False")
        session.prefill(prompt)
        good = tmp_path / "good.bin"
        session.save_slot(good)
        data = good.read_bytes()
        cases = {"truncated": data[: len(data) // 2], "empty": b"", "garbage": b"x" * 100,
                 "flipped": data[:-1] + bytes([data[-1] ^ 0xFF])}
        for name, blob in cases.items():
            bad = tmp_path / f"{name}.bin"
            bad.write_bytes(blob)
            with pytest.raises(SlotError):
                session.restore_slot(bad)
        with pytest.raises(SlotError):
            session.restore_slot(tmp_path / "missing.bin")
        assert session.history == tuple(prompt)  # a refused restore changes nothing
        assert session.next().tokens


__all__ = ["SlotChecks"]
