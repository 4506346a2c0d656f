"""Helpers the checks share, for a plugin's own tests too: run a session to its final step,
the token ids of a list of steps, a long prompt of in-vocabulary ids.
"""

from __future__ import annotations

from ..backend.session import Session
from ..backend.types import Step


def run_to_end(session: Session, max_steps: int = 100_000, step_tokens: int | None = None
               ) -> list[Step]:
    """Call ``next()`` until a final step; return every step."""
    steps = []
    for _ in range(max_steps):
        step = session.next(step_tokens)
        steps.append(step)
        if step.final:
            return steps
    raise AssertionError(f"no final step after {max_steps} next() calls")


def generated_tokens(steps: list[Step]) -> list[int]:
    """All token ids of a list of steps."""
    return [t for s in steps for t in s.tokens]


def long_prompt(session: Session, n_tokens: int, text: str) -> list[int]:
    """``n_tokens`` in-vocabulary ids made by tokenizing ``text`` repeatedly."""
    unit = session.tokenize(text, add_special=False) or [0]
    ids = (unit * (n_tokens // len(unit) + 1))[:n_tokens]
    return ids


__all__ = ["generated_tokens", "long_prompt", "run_to_end"]
