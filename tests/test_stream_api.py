"""The stream API over the scripted backend: iteration, text prompts, metrics, async, cancel,
config and option validation, the one-call ``generate``."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import make_bundle
from scripted_backend import ScriptedFactory

from eliza_backends import (
    CancelledError,
    InferenceContext,
    InvalidArgumentError,
    Registry,
    StreamConfig,
    UnsupportedOperationError,
    generate,
    hookimpl,
    open_stream,
)


class _Plugin:
    def __init__(self, *factories: ScriptedFactory) -> None:
        self.factories = list(factories)

    @hookimpl
    def eliza_backends_factories(self) -> list[ScriptedFactory]:
        return self.factories


@pytest.fixture
def registry() -> Registry:
    reg = Registry(entry_points=False)
    reg.register(_Plugin(ScriptedFactory()), name="scripted-plugin")
    return reg


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    return make_bundle(tmp_path / "b", "m.scripted")


def test_iterate_text_and_metrics(bundle: Path, registry: Registry) -> None:
    with open_stream(bundle, registry=registry, environ={}, max_tokens=20,
                     ignore_eos=True, tokens_per_step=3) as stream:
        assert stream.backend == "scripted"
        n = stream.prefill("hello")
        assert n == 6  # BOS + 5 bytes
        steps = list(stream)
        assert steps[-1].final and sum(len(s.tokens) for s in steps) == 20
        m = stream.metrics
        assert m.prefill_tokens == 6 and m.decode_tokens == 20 and m.turns == 1
        assert m.time_to_first_token is not None and m.time_to_first_token > 0
        assert m.decode_tokens_per_second > 0 and m.acceptance_rate is None
        assert set(m.to_dict()) >= {"decode_tokens_per_second", "time_to_first_token"}


def test_second_turn_text_gets_no_bos(bundle: Path, registry: Registry) -> None:
    with open_stream(bundle, registry=registry, environ={}, max_tokens=4) as stream:
        stream.prefill("ab")
        stream.text()
        before = stream.session.n_past
        stream.prefill("cd")
        assert stream.session.history[before:] == (99, 100)
        assert stream.metrics.turns == 2


def test_generate_one_call(bundle: Path, registry: Registry) -> None:
    text = generate(bundle, "hello", registry=registry, environ={}, max_tokens=10,
                    ignore_eos=True)  # type: ignore[call-arg]
    assert isinstance(text, str) and len(text) == 10


def test_async_iteration_does_not_block_the_loop(bundle: Path, registry: Registry) -> None:
    async def main() -> tuple[int, int]:
        ticks = 0
        stop = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(ticker())
        with open_stream(bundle, registry=registry, environ={}, max_tokens=200,
                         ignore_eos=True) as stream:
            stream.prefill("x")
            n = 0
            async for step in stream:
                n += len(step.tokens)
        stop.set()
        await task
        return n, ticks

    n, ticks = asyncio.run(main())
    assert n == 200 and ticks > 10


def test_cancel_from_another_thread_then_reset(bundle: Path, registry: Registry) -> None:
    with open_stream(bundle, registry=registry, environ={}, max_tokens=100_000,
                     context_size=200_000, batch_size=512, ignore_eos=True,
                     tokens_per_step=100_000) as stream:
        stream.prefill("x")
        timer = threading.Timer(0.05, stream.cancel)
        timer.start()
        with pytest.raises(CancelledError):
            stream.text()
        timer.join()
        stream.reset()
        stream.prefill("y")
        assert len(stream.next(2).tokens) == 2


def test_shared_context_between_streams(bundle: Path, registry: Registry) -> None:
    with InferenceContext(bundle) as ctx:
        a = open_stream(ctx, registry=registry, environ={})
        b = open_stream(ctx, registry=registry, environ={})
        a.close()
        assert not ctx.closed  # a stream on a caller's context leaves it open
        b.prefill("q")
        assert b.next().tokens
    assert b.session.closed


@pytest.mark.parametrize("bad", [
    {"context_size": 0}, {"temperature": -1}, {"top_p": 0}, {"stop": ("",)},
    {"batch_size": 4096, "context_size": 1024}, {"nonsense": 1}, {"draft_model": "x"},
    {"max_tokens": "many"},
])
def test_invalid_config_is_a_typed_error(bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        StreamConfig.build(**bad)
    assert "invalid StreamConfig" in info.value.message


def test_config_is_immutable() -> None:
    cfg = StreamConfig()
    with pytest.raises(ValueError, match="frozen"):
        cfg.max_tokens = 3  # type: ignore[misc]
    assert StreamConfig.build(cfg, stop="END").stop == ("END",)


def test_unknown_backend_options_fail_before_load(bundle: Path, registry: Registry) -> None:
    with pytest.raises(InvalidArgumentError, match="takes no options"):
        open_stream(bundle, registry=registry, environ={},
                    options={"scripted": {"turbo": True}})
    # options for other backends are ignored: a config can carry options for several
    with open_stream(bundle, registry=registry, environ={},
                     options={"llama.cpp": {"n_gpu_layers": 1}}) as stream:
        assert stream.backend == "scripted"


def test_misspelled_option_key_is_refused(bundle: Path, registry: Registry) -> None:
    with pytest.raises(InvalidArgumentError, match="names no backend"):
        open_stream(bundle, registry=registry, environ={}, options={"llamacp": {"x": 1}})


def test_config_constructor_raises_typed_errors() -> None:
    with pytest.raises(InvalidArgumentError, match="temperature"):
        StreamConfig(temperature=-1)
    assert StreamConfig(stop="END").stop == ("END",)


def test_unsupported_drafter_is_refused(bundle: Path, registry: Registry) -> None:
    with pytest.raises(UnsupportedOperationError, match="drafter"):
        open_stream(bundle, registry=registry, environ={}, drafter="ngram")
