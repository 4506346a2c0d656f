"""Per-turn settings (issue 27): ``max_tokens`` and ``stop`` set per turn on a stream or a
session, the way ``set_output`` sets a constraint: from the next prefill on, for the turns
after it, None going back to the config's. Every backend, on the tiny bundle's real models.
"""

from __future__ import annotations

import importlib.util
import json
from typing import Any

import pytest
from conftest import TINY_BUNDLE

from eliza_backends import InvalidArgumentError, Stream, open_stream
from eliza_backends.serving import serving_config

ORACLE = json.loads((TINY_BUNDLE / "oracle.json").read_text())
GETTYSBURG = next(p for p in ORACLE["prompts"] if p["name"] == "gettysburg")
PROMPT = "Four score and seven years ago"
TEXT = GETTYSBURG["continuation_text"]  # " our fathers brought forth on ..."

VARIANTS = [
    ("llama.cpp", "llama_cpp", {}),
    ("litert-lm", "ai_edge_litert", {}),
    ("litert-lm", "litert_lm", {"litert-lm": {"session": "engine"}}),
    ("mlx", "mlx_lm", {}),
]


def _variants() -> list[Any]:
    return [pytest.param((backend, options), id=backend + ("/engine" if options else ""),
                         marks=[] if importlib.util.find_spec(module) else [
                             pytest.mark.skip(reason=f"{module} is not installed")])
            for backend, module, options in VARIANTS]


@pytest.fixture(params=_variants())
def stream(request: pytest.FixtureRequest) -> Any:
    backend, options = request.param
    with open_stream(TINY_BUNDLE, backend=backend, threads=1, max_tokens=4,
                     options=options) as s:
        yield s


def _turn(stream: Stream) -> tuple[str, int, str | None]:
    stream.reset()
    stream.prefill(PROMPT)
    steps = list(stream)
    return ("".join(s.text for s in steps), sum(len(s.tokens) for s in steps),
            steps[-1].finish_reason)


def test_a_turn_budget_past_the_config_budget(stream: Stream) -> None:
    text, n, reason = _turn(stream)
    assert (n, reason) == (4, "length") and TEXT.startswith(text)
    stream.set_turn(max_tokens=12)
    text, n, reason = _turn(stream)
    assert (n, reason) == (12, "length") and TEXT.startswith(text) and len(text) > 4
    stream.set_turn(max_tokens=2)
    assert _turn(stream)[1:] == (2, "length")
    stream.set_turn()  # back to the config's
    assert _turn(stream)[1:] == (4, "length")


def test_stop_strings_per_turn(stream: Stream) -> None:
    stream.set_turn(max_tokens=32, stop=["forth", "zzz"])
    text, _, reason = _turn(stream)
    assert text == TEXT[:TEXT.index("forth")] and reason == "stop"
    stream.set_turn(max_tokens=32, stop=None)  # the config's: none
    text, _, reason = _turn(stream)
    assert "forth" in text


def test_settings_take_effect_at_the_next_prefill(stream: Stream) -> None:
    stream.reset()
    stream.prefill(PROMPT)
    stream.set_turn(max_tokens=1)  # this turn keeps the config's budget of 4
    assert sum(len(s.tokens) for s in stream) == 4
    stream.prefill(" And")
    assert sum(len(s.tokens) for s in stream) == 1  # the next one has the new budget


@pytest.mark.parametrize("kwargs", [{"max_tokens": 0}, {"max_tokens": True},
                                    {"max_tokens": 2.0}, {"stop": ""}, {"stop": [""]},
                                    {"stop": [1]}, {"stop": b"x"}])
def test_bad_settings_are_refused(kwargs: dict[str, Any]) -> None:
    with open_stream(TINY_BUNDLE, backend="llama.cpp", threads=1, max_tokens=4) as s:
        with pytest.raises(InvalidArgumentError):
            s.set_turn(**kwargs)
        s.prefill(PROMPT)
        assert sum(len(step.tokens) for step in s) == 4  # nothing changed


def test_serving_sessions_keep_the_config_budget() -> None:
    """The OpenAI layer sets each request's budget per turn: its sessions are opened with
    the config as given, not a budget of the whole window."""
    config = serving_config({"max_tokens": 7, "stop": ["x"], "context_size": 512})
    assert (config.max_tokens, config.stop, config.context_size) == (7, ("x",), 512)
