"""The conformance kit: test classes that check a backend against the whole contract.

A plugin author subclasses :class:`BackendConformance` in their test suite and provides two
fixtures, ``factory`` (a Factory instance) and ``bundle_dir`` (a bundle it can serve)::

    import pytest
    from eliza_backends.testing import BackendConformance
    from my_backend_plugin import MyFactory

    class TestMyBackend(BackendConformance):
        @pytest.fixture
        def factory(self):
            return MyFactory()

        @pytest.fixture
        def bundle_dir(self):
            return Path("tests/data/my-bundle")

Optional overrides: ``base_config`` (a dict of StreamConfig fields), ``prompt_text``.
Checks that depend on an optional feature are skipped with the reason when
``session.capabilities`` says the feature is absent, never silently.

:class:`BackendConformance` is the aggregate of one mixin per area (as fsspec's abstract tests
and pandas' extension tests): :class:`FactoryChecks`, :class:`GenerationChecks`,
:class:`RewindChecks`, :class:`CancelChecks`, :class:`SlotChecks`, :class:`InputChecks`,
:class:`SpeculativeChecks`, :class:`SamplingChecks`, :class:`ChatChecks`,
:class:`LogitsChecks`. While developing a backend, subclass only the mixins you are working on
(each brings the fixtures through :class:`KitFixtures`); in the plugin's suite subclass the
aggregate, so a check added to the kit is never missed. The kit uses only the public API of
sessions and factories.

This module is registered as a pytest plugin (``pytest11`` entry point); importing it outside
pytest is not supported.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from .backend.context import InferenceContext
from .backend.factory import Factory
from .backend.session import Session
from .backend.types import Capabilities, Step
from .config import StreamConfig
from .errors import (
    BundleError,
    CancelledError,
    ContextFullError,
    InvalidArgumentError,
    SessionBusyError,
    SessionClosedError,
    SlotError,
    UnsupportedOperationError,
)
from .prompt.chat import render_chat
from .prompt.chat_tokens import chat_token_ids
from .structured.constraint import Constraint


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


class KitFixtures:
    """The fixtures every check uses. Provide ``factory`` and ``bundle_dir``; every test opens
    its own sessions on one shared context and closes them."""

    #: StreamConfig fields every session of the kit uses (override per backend if needed).
    base_config: ClassVar[dict[str, Any]] = {
        "context_size": 512, "batch_size": 64, "max_tokens": 24, "threads": 1,
    }
    #: Text the kit tokenizes to make prompts.
    prompt_text: str = "The quick brown fox jumps over the lazy dog. "

    # ------------------------------------------------------------------ fixtures

    @pytest.fixture
    def factory(self) -> Factory:
        raise NotImplementedError("provide a `factory` fixture returning your Factory")

    @pytest.fixture
    def bundle_dir(self) -> Path:
        raise NotImplementedError("provide a `bundle_dir` fixture: a bundle your backend serves")

    @pytest.fixture
    def context(self, bundle_dir: Path) -> Iterator[InferenceContext]:
        ctx = InferenceContext(bundle_dir)
        yield ctx
        ctx.close()

    @pytest.fixture
    def open_session(self, factory: Factory, context: InferenceContext) -> Any:
        """``open_session(**config_overrides) -> Session`` on the shared context."""

        def _open(**overrides: Any) -> Session:
            cfg = StreamConfig.build({**self.base_config, **overrides})
            try:
                with context.opening():
                    session = factory.open(context, cfg)
            except UnsupportedOperationError:
                if not cfg.ignore_eos:
                    raise
                # a runtime that ends at its stop tokens itself refuses ignore_eos (and must
                # declare it): the checks asking for a long run get the longest it gives
                cfg = StreamConfig.build({**self.base_config, **overrides, "ignore_eos": False})
                with context.opening():
                    session = factory.open(context, cfg)
                assert not session.capabilities.ignore_eos, (
                    "open() refused ignore_eos=True but capabilities.ignore_eos is True")
            assert isinstance(session, Session), f"open() returned {session!r}"
            return session

        return _open

    @pytest.fixture
    def session(self, open_session: Any) -> Iterator[Session]:
        s = open_session()
        yield s
        s.close()

    @pytest.fixture
    def prompt(self, session: Session) -> list[int]:
        return session.tokenize(self.prompt_text, add_special=True)



class FactoryChecks(KitFixtures):
    """The factory describes itself and the session declares honest capabilities."""

    def test_factory_describes_itself(self, factory: Factory, bundle_dir: Path,
                                      tmp_path: Path) -> None:
        assert isinstance(factory.name, str) and factory.name
        assert all(isinstance(a, str) and a for a in factory.aliases)
        avail = factory.available()
        assert avail, f"backend must be available to run the kit: {avail.reason}"
        assert isinstance(factory.preference_rank(), int)
        assert factory.can_serve(bundle_dir)
        assert not factory.can_serve(tmp_path)
        assert not factory.can_serve(tmp_path / "missing")

    def test_capabilities_are_declared(self, session: Session) -> None:
        caps = session.capabilities
        assert isinstance(caps, Capabilities)
        assert "none" in caps.drafters
        assert session.vocab_size > 0
        assert session.context_size >= 16
        assert all(0 <= t < session.vocab_size for t in session.eog_token_ids)

    def test_ignore_eos_is_honoured_or_refused(self, factory: Factory,
                                               context: InferenceContext) -> None:
        """A session either honours ``ignore_eos`` or refuses it at open: never accepts and
        ignores it."""
        with context.opening():
            plain = factory.open(context, StreamConfig.build(self.base_config))
        with plain:
            honours = plain.capabilities.ignore_eos
        cfg = StreamConfig.build({**self.base_config, "ignore_eos": True})
        if honours:
            try:
                with context.opening():
                    factory.open(context, cfg).close()
            except UnsupportedOperationError as exc:
                pytest.fail(f"open() refused ignore_eos=True ({exc}) but "
                            "capabilities.ignore_eos is True")
        else:
            with pytest.raises(UnsupportedOperationError), context.opening():
                factory.open(context, cfg).close()



class GenerationChecks(KitFixtures):
    """Prefill, steps, budget, determinism, UTF-8-safe text, stop strings, a full context."""

    def test_prefill_next_until_final(self, session: Session, prompt: list[int]) -> None:
        session.prefill(prompt)
        assert session.n_past == len(prompt)
        steps = run_to_end(session)
        tokens = generated_tokens(steps)
        assert 1 <= len(tokens) <= session.config.max_tokens
        assert steps[-1].final and steps[-1].finish_reason in ("eos", "stop", "length", "context")
        assert all(not s.final for s in steps[:-1])
        assert all(0 <= t < session.vocab_size for t in tokens)
        again = session.next()
        assert again.final and again.tokens == ()

    def test_budget_ends_with_length(self, open_session: Any, prompt: list[int]) -> None:
        with open_session(max_tokens=5, ignore_eos=True) as s:
            s.prefill(prompt)
            steps = run_to_end(s)
            assert len(generated_tokens(steps)) == 5
            assert steps[-1].finish_reason == "length"

    def test_multi_token_steps_match_single_steps(self, open_session: Any,
                                                  prompt: list[int]) -> None:
        with open_session(ignore_eos=True, max_tokens=12) as one, \
                open_session(ignore_eos=True, max_tokens=12, tokens_per_step=5) as many:
            one.prefill(prompt)
            many.prefill(prompt)
            single = run_to_end(one)
            multi = run_to_end(many)
            assert generated_tokens(single) == generated_tokens(multi)
            assert max(len(s.tokens) for s in multi) > 1
            assert all(len(s.tokens) <= 5 for s in multi)
            assert "".join(s.text for s in single) == "".join(s.text for s in multi)

    def test_greedy_is_deterministic(self, open_session: Any, prompt: list[int]) -> None:
        outs = []
        for _ in range(2):
            with open_session() as s:
                s.prefill(prompt)
                outs.append(generated_tokens(run_to_end(s)))
        assert outs[0] == outs[1]

    def test_text_is_utf8_safe_and_matches_tokens(self, open_session: Any) -> None:
        with open_session(ignore_eos=True, max_tokens=32) as s:
            ids = s.tokenize("héllo wörld ✓ 日本語 🙂 ", add_special=True)
            s.prefill(ids)
            steps = run_to_end(s)
            text = "".join(st.text for st in steps)
            assert text == s.detokenize([t for t in generated_tokens(steps)
                                         if t not in s.eog_token_ids])
            for st in steps:
                st.text.encode("utf-8")  # never a lone surrogate

    def test_stop_string_ends_stream_and_is_not_emitted(self, open_session: Any,
                                                        prompt: list[int]) -> None:
        with open_session(ignore_eos=True, max_tokens=24) as s:
            s.prefill(prompt)
            full = s.detokenize(generated_tokens(run_to_end(s)))
        stop = next((full[i:i + 2] for i in range(len(full) // 3, len(full) - 1)
                     if full[i:i + 2].strip()), None)
        if stop is None:
            pytest.skip("greedy output has no usable stop string candidate")
        with open_session(ignore_eos=True, max_tokens=24, stop=(stop,)) as s:
            s.prefill(prompt)
            steps = run_to_end(s)
            text = "".join(st.text for st in steps)
            assert steps[-1].finish_reason == "stop"
            assert stop not in text
            assert text == full[: full.index(stop)]

    def test_context_end_finishes_stream(self, open_session: Any) -> None:
        with open_session(context_size=32, batch_size=16, max_tokens=100_000,
                          ignore_eos=True, tokens_per_step=16) as s:
            ids = long_prompt(s, s.context_size - 8, self.prompt_text)
            s.prefill(ids)
            steps = run_to_end(s)
            assert steps[-1].finish_reason == "context"
            assert s.n_past == s.context_size



class RewindChecks(KitFixtures):
    """reset() forgets; reset_keep() reuses a prefix (or resets fully, if it cannot)."""

    def test_reset_forgets_everything(self, session: Session, prompt: list[int]) -> None:
        session.prefill(prompt)
        first = generated_tokens(run_to_end(session))
        session.reset()
        assert session.n_past == 0
        session.prefill(prompt)
        assert generated_tokens(run_to_end(session)) == first

    def test_reset_keep_reuses_prefix(self, open_session: Any, prompt: list[int]) -> None:
        head, tail = prompt[: len(prompt) // 2], prompt[len(prompt) // 2:]
        with open_session() as fresh:
            fresh.prefill(prompt)
            expected = generated_tokens(run_to_end(fresh))
        with open_session() as s:
            s.prefill(head)
            s.prefill([7 % s.vocab_size] * 3)
            run_to_end(s)
            kept = s.reset_keep(len(head))
            if s.capabilities.prefix_reuse:
                assert kept == len(head)
                assert s.history == tuple(head)
                s.prefill(tail)
            else:
                assert kept == 0
                assert s.n_past == 0
                s.prefill(prompt)
            assert generated_tokens(run_to_end(s)) == expected

    def test_reset_keep_bounds(self, session: Session, prompt: list[int]) -> None:
        session.prefill(prompt)
        assert session.reset_keep(10 * len(prompt)) in (len(prompt), 0)
        with pytest.raises(InvalidArgumentError):
            session.reset_keep(-1)
        assert session.reset_keep(0) == 0
        assert session.n_past == 0

    def test_next_after_reset_keep_needs_prefill(self, session: Session,
                                                 prompt: list[int]) -> None:
        session.prefill(prompt)
        session.reset_keep(len(prompt) - 1)
        with pytest.raises(InvalidArgumentError):
            session.next()



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



class InputChecks(KitFixtures):
    """Bad ids, call order, overflow, use after close, tokenization."""

    def test_bad_token_ids_are_refused(self, session: Session) -> None:
        bad_inputs: list[Any] = [[], [-1], [session.vocab_size], [1.5], ["a"], "text", None,
                                 [True]]
        for bad in bad_inputs:
            with pytest.raises(InvalidArgumentError):
                session.prefill(bad)
        assert session.n_past == 0

    def test_next_before_prefill(self, session: Session) -> None:
        with pytest.raises(InvalidArgumentError):
            session.next()
        with pytest.raises(InvalidArgumentError):
            session.next(0)

    def test_context_overflow(self, open_session: Any) -> None:
        with open_session(context_size=64, batch_size=16) as s:
            ids = long_prompt(s, s.context_size + 1, self.prompt_text)
            with pytest.raises(ContextFullError):
                s.prefill(ids)
            s.prefill(ids[:10])
            with pytest.raises(ContextFullError):
                s.prefill(ids[: s.context_size - 9])
            assert s.n_past == 10

    def test_use_after_close(self, open_session: Any, prompt: list[int]) -> None:
        s = open_session()
        s.prefill(prompt)
        s.close()
        s.close()
        for call in (lambda: s.prefill(prompt), s.next, s.reset, lambda: s.tokenize("x")):
            with pytest.raises(SessionClosedError):
                call()

    def test_tokenize_round_trip(self, session: Session) -> None:
        text = "Hello, world! 123"
        ids = session.tokenize(text, add_special=False)
        assert ids and all(0 <= t < session.vocab_size for t in ids)
        assert session.detokenize(ids) == text
        with_bos = session.tokenize(text, add_special=True)
        if session.bos_token_id is not None:
            assert with_bos[0] == session.bos_token_id

    def test_tokenize_parse_special_off_never_gives_control_tokens(self,
                                                                  session: Session) -> None:
        controls = sorted(session.model_info.control_texts)[:16]
        if not controls:
            pytest.skip("the model has no control-token texts")
        text = "a" + "a".join(controls)
        ids = session.tokenize(text, add_special=False, parse_special=False)
        singles = {tuple(session.tokenize(c, add_special=False)) for c in controls}
        assert not any((t,) in singles for t in ids)
        assert session.detokenize(ids) == text


class SpeculativeChecks(KitFixtures):
    """Every drafter keeps greedy output identical, through rewinds too, with honest counts."""

    def _drafters(self, open_session: Any) -> list[str]:
        with open_session() as probe:
            drafters = sorted(probe.capabilities.drafters - {"none"})
        if not drafters:
            pytest.skip("capabilities.drafters offers no speculative drafter")
        return drafters

    def test_drafters_keep_greedy_output(self, open_session: Any, prompt: list[int]) -> None:
        drafters = self._drafters(open_session)
        repeat = prompt + prompt[1:] + prompt[1:]  # something for prompt lookup to find
        with open_session(ignore_eos=True, max_tokens=24) as plain:
            plain.prefill(repeat)
            expected = generated_tokens(run_to_end(plain))
        for kind in drafters:
            try:
                s = open_session(ignore_eos=True, max_tokens=24, drafter=kind, draft_length=4,
                                 draft_policy="fixed")  # the rounds themselves
            except BundleError as exc:
                assert kind in ("model", "mtp"), exc
                continue  # no draft artifact in this bundle: nothing to check for this kind
            with s:
                s.prefill(repeat)
                steps = run_to_end(s)
                assert generated_tokens(steps) == expected, kind
                for st in steps:
                    assert 0 <= st.accepted <= st.drafted
                assert sum(st.drafted for st in steps) > 0, kind

    def test_drafters_follow_rewinds(self, open_session: Any, prompt: list[int]) -> None:
        repeat = prompt + prompt[1:]
        with open_session(ignore_eos=True, max_tokens=12) as plain:
            plain.prefill(repeat)
            expected = generated_tokens(run_to_end(plain))
        for kind in self._drafters(open_session):
            try:
                s = open_session(ignore_eos=True, max_tokens=12, drafter=kind, draft_length=3,
                                 draft_policy="fixed")
            except BundleError as exc:
                assert kind in ("model", "mtp"), exc
                continue
            with s:
                s.prefill(repeat)
                run_to_end(s)
                kept = s.reset_keep(len(repeat) - 2)
                s.prefill(repeat[kept:])
                assert generated_tokens(run_to_end(s)) == expected, kind
                s.reset()
                s.prefill(repeat)
                assert generated_tokens(run_to_end(s)) == expected, kind


class SamplingChecks(KitFixtures):
    """A seed makes sampling reproducible (if the session samples at all)."""

    def test_sampling_is_seeded(self, open_session: Any, prompt: list[int]) -> None:
        with open_session() as probe:
            if not probe.capabilities.sampling:
                pytest.skip("capabilities.sampling is False (greedy only)")
        outs = []
        for seed in (7, 7):
            with open_session(temperature=1.0, seed=seed, ignore_eos=True) as s:
                s.prefill(prompt)
                outs.append(generated_tokens(run_to_end(s)))
        assert outs[0] == outs[1]


class ChatChecks(KitFixtures):
    """Chat prompts: message content never becomes control tokens; the ordinary case is the
    rendered prompt tokenized whole."""

    def _template(self, session: Session) -> str:
        if not session.chat_template:
            pytest.skip("the model ships no chat template")
        return session.chat_template

    def test_chat_ids_are_the_rendered_prompt_tokenized(self, session: Session) -> None:
        template = self._template(session)
        msgs = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": self.prompt_text}]
        text = render_chat(template, msgs, add_generation_prompt=True,
                           **session.template_tokens)
        assert chat_token_ids(session, template, msgs) == \
            session.tokenize(text, add_special=False)

    def test_message_content_cannot_forge_control_tokens(self, session: Session) -> None:
        template = self._template(session)
        controls = sorted(session.model_info.control_texts)[:16]
        if not controls:
            pytest.skip("the model has no control-token texts")
        singles = [session.tokenize(c, add_special=False) for c in controls]
        control_ids = {ids[0] for ids in singles if len(ids) == 1}

        def markup(content: str) -> list[int]:
            ids = chat_token_ids(session, template, [{"role": "user", "content": content}])
            return [t for t in ids if t in control_ids]

        assert markup("hi " + " ".join(controls) + " bye") == markup("hi bye")


class LogitsChecks(KitFixtures):
    """The logits hook (``capabilities.logits``): constrained output follows its constraint,
    the same in multi-token steps, and logprobs are consistent; without it, constraints and
    logprobs are refused, never ignored."""

    #: The JSON schema the kit constrains to (small, so any model finishes it in the budget).
    kit_schema: ClassVar[dict[str, Any]] = {
        "type": "object", "properties": {"ok": {"type": "boolean"},
                                         "n": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["ok", "n"], "additionalProperties": False}

    def _needs_logits(self, session: Session) -> None:
        if not session.capabilities.logits:
            pytest.skip("capabilities.logits is False (no constraints, no logprobs)")
        pytest.importorskip("llguidance", reason="constraints need eliza-backends[structured]")

    def test_without_logits_constraints_are_refused(self, session: Session) -> None:
        if session.capabilities.logits:
            pytest.skip("capabilities.logits is True")
        from .structured.logits import OutputSpec

        with pytest.raises(UnsupportedOperationError):
            session.set_output(OutputSpec(Constraint.regex("[a-z]+")))
        with pytest.raises(UnsupportedOperationError):
            session.set_output(OutputSpec(logprobs=True))

    def test_json_schema_output_is_valid(self, open_session: Any, prompt: list[int]) -> None:
        import json

        with open_session(max_tokens=48) as probe:
            self._needs_logits(probe)
        with open_session(json_schema=self.kit_schema, max_tokens=48) as s:
            s.prefill(prompt)
            steps = run_to_end(s)
            assert steps[-1].finish_reason == "eos", "the constraint ends the text"
            data = json.loads("".join(st.text for st in steps))
            assert set(data) == {"ok", "n"} and isinstance(data["ok"], bool)
            assert isinstance(data["n"], int) and 0 <= data["n"] <= 99

    def test_regex_output_matches_in_multi_token_steps(self, open_session: Any,
                                                       prompt: list[int]) -> None:
        import re

        pattern = r"[a-z]{2,6}( [a-z]{2,6}){1,3}\."
        with open_session(max_tokens=48) as probe:
            self._needs_logits(probe)
        texts, ids = [], []
        for per_step in (1, 4):
            with open_session(regex=pattern, max_tokens=48, tokens_per_step=per_step) as s:
                s.prefill(prompt)
                steps = run_to_end(s)
                texts.append("".join(st.text for st in steps))
                ids.append(generated_tokens(steps))
        assert re.fullmatch(pattern, texts[0]), texts[0]
        assert ids[0] == ids[1] and texts[0] == texts[1]

    def test_constraint_restarts_at_each_prefill(self, open_session: Any,
                                                 prompt: list[int]) -> None:
        with open_session(max_tokens=48) as probe:
            self._needs_logits(probe)
        with open_session(regex=r"[0-9]{3}", max_tokens=48) as s:
            for _ in range(2):
                s.prefill(prompt)
                text = "".join(st.text for st in run_to_end(s))
                assert len(text) == 3 and text.isdigit(), text

    def test_logprobs_are_consistent(self, open_session: Any, prompt: list[int]) -> None:
        with open_session(max_tokens=8) as probe:
            self._needs_logits(probe)
        with open_session(top_logprobs=3, max_tokens=8, ignore_eos=True) as s:
            s.prefill(prompt)
            steps = run_to_end(s)
            for step in steps:
                assert step.logprobs is not None and len(step.logprobs) == len(step.tokens)
                for tok, lp in zip(step.tokens, step.logprobs, strict=True):
                    assert lp.token == tok and lp.logprob <= 1e-6 and len(lp.top) == 3
                    assert [t.logprob for t in lp.top] == sorted(
                        (t.logprob for t in lp.top), reverse=True)
                    # greedy: the chosen token is the most likely one
                    assert lp.top[0].token == tok and abs(lp.top[0].logprob - lp.logprob) < 1e-9
        with open_session(max_tokens=4) as plain:
            plain.prefill(prompt)
            assert all(st.logprobs is None for st in run_to_end(plain))

    def test_set_output_per_turn(self, open_session: Any, prompt: list[int]) -> None:
        from .structured.logits import OutputSpec

        with open_session(max_tokens=48) as s:
            self._needs_logits(s)
            s.set_output(OutputSpec(Constraint.regex("(yes|no)"), logprobs=True))
            s.prefill(prompt)
            steps = run_to_end(s)
            assert "".join(st.text for st in steps) in ("yes", "no")
            assert steps[0].logprobs is not None
            s.set_output(None)  # back to the config's: nothing
            s.reset()
            s.prefill(prompt)
            assert all(st.logprobs is None for st in run_to_end(s))

    def test_constraint_with_a_drafter_is_refused(self, open_session: Any) -> None:
        with open_session() as probe:
            self._needs_logits(probe)
            drafters = sorted(probe.capabilities.drafters - {"none"})
        if not drafters:
            pytest.skip("no drafter to combine with")
        from .stream import check_capabilities

        with open_session(drafter=drafters[0], regex="[a-z]+") as s, \
                pytest.raises(UnsupportedOperationError):
            check_capabilities(s, s.config, "kit")


class BackendConformance(FactoryChecks, GenerationChecks, RewindChecks, CancelChecks,
                         SlotChecks, InputChecks, SpeculativeChecks, SamplingChecks, ChatChecks,
                         LogitsChecks):
    """Every contract check for one backend. Subclass and provide ``factory`` and
    ``bundle_dir`` fixtures (see :class:`KitFixtures`)."""


__all__ = ["BackendConformance", "CancelChecks", "ChatChecks", "FactoryChecks",
           "GenerationChecks", "InputChecks", "KitFixtures", "LogitsChecks", "RewindChecks",
           "SamplingChecks",
           "SlotChecks", "SpeculativeChecks", "generated_tokens", "long_prompt", "run_to_end"]
