"""One check for every backend's ``drafter="mtp"``: rewinds keep target and assistant in step.

reset_keep (inside the prompt, inside the generated text), reset, a slot restored in a fresh
session (and the saver going on), and cancel: each continues with the plain greedy tokens and
drafts again. Used by tests/test_mtp.py (llama.cpp) and tests/test_mlx_mtp.py (MLX).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from eliza_backends import CancelledError, InferenceContext, Step, open_stream
from eliza_backends.testing import generated_tokens, run_to_end


def check_mtp_rewinds(ctx: InferenceContext, backend: str, ids: list[int], base: dict[str, Any],
                      tmp_path: Path) -> None:
    """Run the rewinds on ``backend`` over ``ids`` (``base``: the stream settings)."""
    with open_stream(ctx, backend=backend, **base, max_tokens=64, ignore_eos=True) as s:
        s.prefill(ids)
        expected = generated_tokens(run_to_end(s.session))

    def continues(head: list[int], steps: list[Step]) -> None:
        out = head + generated_tokens(steps)
        assert out == expected[:len(out)] and sum(st.drafted for st in steps) > 0

    cfg = {**base, "max_tokens": 24, "ignore_eos": True, "drafter": "mtp", "draft_length": 3,
           "draft_policy": "fixed"}
    with open_stream(ctx, backend=backend, **cfg) as s:
        session = s.session
        session.prefill(ids)
        continues([], run_to_end(session))
        kept = session.reset_keep(len(ids) - 3)  # inside the prompt
        session.prefill(ids[kept:])
        continues([], run_to_end(session))
        session.reset()
        session.prefill(ids)
        first = list(session.next(5).tokens)
        session.reset_keep(len(ids) + 2)  # inside the generated text
        session.prefill(first[2:])
        continues(first, run_to_end(session))
        session.reset()
        session.prefill(ids)
        head = list(session.next(6).tokens)
        session.save_slot(tmp_path / "mtp.slot")
        with open_stream(ctx, backend=backend, **cfg) as t:
            t.session.restore_slot(tmp_path / "mtp.slot")
            continues(head, run_to_end(t.session))
        continues(head, run_to_end(session))  # saving changed nothing for the saver
        session.cancel()
        with pytest.raises(CancelledError):
            session.next()
        session.reset()
        session.prefill(ids)
        continues([], run_to_end(session))
