"""Gemma 4's MTP assistant as the llama.cpp drafter (``drafter="mtp"``), on a tiny Gemma 4 pair
(target + gemma4-assistant, f32 GGUFs): the real llama.cpp, the core's one speculative loop.

Greedy output equals plain greedy output (past the sliding window too), every step reports
honest drafted/accepted counts, sampled output follows the target distribution, and rewinds
(reset, reset_keep, slots, cancel) keep target and assistant in step. The conformance kit's
speculative checks run with the MTP drafter on the pair.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, TINY_BUNDLE
from mtp_rewinds import check_mtp_rewinds

pytest.importorskip("llama_cpp")

from eliza_llamacpp import LlamaCppFactory

from eliza_backends import (
    BundleError,
    Factory,
    InferenceContext,
    StreamConfig,
    UnsupportedOperationError,
    open_stream,
)
from eliza_backends.backend import accept_sampled
from eliza_backends.testing import SpeculativeChecks, generated_tokens, run_to_end

#: The tiny Gemma 4 family (tools/make_gemma4_tiny.py): its target and gemma4_assistant as
#: llama.cpp's converter wrote them (text/draft/mtp/).
MTP_BUNDLE = ROOT / "examples" / "bundles" / "gemma4-tiny"
#: Ordinary prompts of the tiny family (its training text: where its assistant was distilled)
PROMPTS = [
    "We hold these truths to be self-evident,",
    "Ships that passed in the dark",
    "The river does not hurry",
    "Four score and seven years ago",
]
BASE = {"threads": 1, "context_size": 512, "batch_size": 64}


@pytest.fixture(scope="module")
def ctx() -> InferenceContext:
    with InferenceContext(MTP_BUNDLE) as c:
        yield c


def _run(ctx: InferenceContext, prompt: str | list[int], **config: object) -> tuple[list[int],
                                                                                int, int]:
    with open_stream(ctx, backend="llama.cpp", **{**BASE, **config}) as s:  # type: ignore
        s.prefill(prompt)
        steps = run_to_end(s.session)
        for st in steps:
            assert 0 <= st.accepted <= st.drafted
        return (generated_tokens(steps), sum(st.drafted for st in steps),
                sum(st.accepted for st in steps))


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("k", [1, 4])
def test_mtp_greedy_output_is_plain_greedy_output(ctx: InferenceContext, prompt: str,
                                                  k: int) -> None:
    plain, _, _ = _run(ctx, prompt, max_tokens=48, ignore_eos=True)
    out, drafted, accepted = _run(ctx, prompt, max_tokens=48, ignore_eos=True, drafter="mtp",
                                  draft_length=k, draft_policy="fixed")
    assert out == plain
    assert drafted > 0 and 0 <= accepted <= drafted


def test_mtp_acceptance_on_ordinary_prompts(ctx: InferenceContext) -> None:
    """The trained assistant's drafts are mostly accepted on the family's own text (its torch
    reference accepts 0.96-1.0 there); every step's counts are honest."""
    drafted = accepted = 0
    for prompt in PROMPTS[:3]:
        _, d, a = _run(ctx, prompt, max_tokens=32, ignore_eos=True, drafter="mtp",
                       draft_length=3, draft_policy="fixed")
        drafted, accepted = drafted + d, accepted + a
    assert drafted > 0 and accepted / drafted >= 0.5, (accepted, drafted)


def test_mtp_chat_prompt_through_the_template(ctx: InferenceContext) -> None:
    """A chat turn through the model's own template: same tokens as plain, drafts accepted."""
    messages = [{"role": "user", "content": "What is two plus two?"}]
    with open_stream(ctx, backend="llama.cpp", **BASE, max_tokens=24) as s:
        s.prefill_messages(messages)
        plain = generated_tokens(run_to_end(s.session))
    with open_stream(ctx, backend="llama.cpp", **BASE, max_tokens=24, drafter="mtp",
                     draft_length=3, draft_policy="fixed") as s:
        s.prefill_messages(messages)
        steps = run_to_end(s.session)
    assert generated_tokens(steps) == plain
    assert sum(st.accepted for st in steps) > 0


def test_mtp_past_the_sliding_window(ctx: InferenceContext) -> None:
    """The assistant reads the target's sliding-window layers too: a prompt and generation
    well past the window (32 tokens in the tiny family) still give the plain greedy tokens."""
    prompt = " ".join(PROMPTS) + " " + PROMPTS[0]
    plain, _, _ = _run(ctx, prompt, max_tokens=96, ignore_eos=True)
    out, drafted, _ = _run(ctx, prompt, max_tokens=96, ignore_eos=True, drafter="mtp",
                           draft_length=3, draft_policy="fixed")
    assert out == plain and drafted > 0


def test_mtp_with_the_auto_policy_is_lossless(ctx: InferenceContext) -> None:
    plain, _, _ = _run(ctx, PROMPTS[1], max_tokens=64, ignore_eos=True)
    out, _, _ = _run(ctx, PROMPTS[1], max_tokens=64, ignore_eos=True, drafter="mtp",
                     draft_length=4, draft_policy="auto")
    assert out == plain


def test_mtp_rewinds_keep_target_and_assistant_in_step(ctx: InferenceContext,
                                                      tmp_path: Path) -> None:
    """reset_keep (inside the prompt, inside the generated text), reset, a slot restored in a
    fresh session, and cancel: each continues with the plain greedy tokens and keeps drafting."""
    with open_stream(ctx, backend="llama.cpp", **BASE) as s:
        ids = s.session.tokenize(PROMPTS[0], add_special=True)
    check_mtp_rewinds(ctx, "llama.cpp", ids, BASE, tmp_path)


def _biased(drafts: Any, target: Any, sampler: Any, is_end: Any) -> tuple[list[int], int]:
    """A broken acceptance rule: a draft the target gives p >= 0.3 is always accepted."""
    out: list[int] = []
    for i, d in enumerate(drafts):
        ids, probs = target(i)
        if float(probs[ids == d].sum()) < 0.3:
            rest, n = accept_sampled(drafts[i:], lambda j, i=i: target(i + j), sampler, is_end)
            return out + rest, i + n
        out.append(d)
    ids, probs = target(len(drafts))
    return [*out, sampler.choose(ids, probs)], len(drafts)


@pytest.mark.parametrize("rule", ["standard", "biased"])
def test_mtp_sampling_keeps_the_target_distribution(ctx: InferenceContext, rule: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Temperature sampling with MTP drafts (greedy, so a one-hot proposal) follows the
    standard acceptance rule: tokens 2-3 of a sampled continuation are distributed as without
    a drafter (total variation over 600 seeds, as for the n-gram and model drafters). Top-k 2
    at temperature 3 keeps the outcomes few and the drafts' probabilities away from 1, so the
    check has power: a rule biased towards the drafts (``rule="biased"``) is caught (measured
    on the tiny family: 0.008 with the standard rule, 0.082 with the biased one; on an earlier
    trained pair 0.025 and 0.12)."""
    import eliza_llamacpp.session as llama_session

    if rule == "biased":
        monkeypatch.setattr(llama_session, "accept_sampled", _biased)
    seeds = 600
    counts: dict[str, Counter[tuple[int, ...]]] = {}
    drafted = accepted = 0
    for kind in ("none", "mtp"):
        counts[kind] = Counter()
        for seed in range(seeds):
            with open_stream(ctx, backend="llama.cpp", **BASE, temperature=3.0, top_k=2,
                             seed=seed, max_tokens=4, ignore_eos=True, drafter=kind,
                             draft_length=3, draft_policy="fixed") as s:
                s.prefill(PROMPTS[0])
                tokens = [t for st in s for t in st.tokens]
                counts[kind][tuple(tokens[1:3])] += 1
                drafted += s.metrics.drafted
                accepted += s.metrics.accepted
    a, b = counts["none"], counts["mtp"]
    tv = 0.5 * sum(abs(a[k] - b[k]) for k in set(a) | set(b)) / seeds
    assert drafted >= seeds and accepted > drafted // 2  # the rule is exercised
    if rule == "standard":
        assert tv < 0.045, (tv, a.most_common(4), b.most_common(4))
    else:
        assert tv > 0.045, (tv, a.most_common(4), b.most_common(4))


def test_mtp_without_an_assistant_is_a_bundle_error() -> None:
    with pytest.raises(BundleError, match="MTP assistant"):
        open_stream(TINY_BUNDLE, backend="llama.cpp", threads=1, drafter="mtp")


def test_assistant_is_not_taken_as_a_draft_model(ctx: InferenceContext) -> None:
    """drafter='model' skips the assistant under text/draft/ (it cannot run on its own)."""
    with pytest.raises(BundleError, match="draft model"):
        open_stream(ctx, backend="llama.cpp", threads=1, drafter="model")


def test_draft_model_path_must_be_an_assistant_for_mtp(ctx: InferenceContext) -> None:
    target = next((MTP_BUNDLE / "text").glob("*.gguf")).relative_to(MTP_BUNDLE)
    with pytest.raises(BundleError, match="not an MTP assistant"):
        open_stream(ctx, backend="llama.cpp", threads=1, drafter="mtp",
                    draft_model=target.as_posix())


def test_other_backends_refuse_mtp_plainly() -> None:
    """A backend without an MTP drafter refuses drafter='mtp' with a typed error naming the
    one that has it (the core's Factory.make_drafter)."""

    class NoMtp(LlamaCppFactory):
        name = "no-mtp"

        def open(self, context: InferenceContext, config: StreamConfig):  # type: ignore
            return self.make_drafter(context, config, None)  # type: ignore[arg-type]

    with InferenceContext(TINY_BUNDLE) as c, pytest.raises(UnsupportedOperationError,
                                                            match="has no MTP drafter"):
        NoMtp().open(c, StreamConfig(drafter="mtp"))


class TestMtpSpeculativeKit(SpeculativeChecks):
    """The conformance kit's speculative checks on the Gemma 4 pair: every drafter the session
    offers (n-gram, MTP; 'model' finds no draft model here) keeps greedy output."""

    @pytest.fixture
    def factory(self) -> Factory:
        return LlamaCppFactory()

    @pytest.fixture
    def bundle_dir(self) -> Path:
        return MTP_BUNDLE


def test_gguf_architecture_probe(tmp_path: Path) -> None:
    from eliza_llamacpp.gguf_header import gguf_architecture

    assistant = next((MTP_BUNDLE / "text" / "draft").rglob("*.gguf"))
    assert gguf_architecture(assistant) == "gemma4-assistant"
    assert gguf_architecture(next((MTP_BUNDLE / "text").glob("*.gguf"))) == "gemma4"
    assert gguf_architecture(next((TINY_BUNDLE / "text").glob("*.gguf"))) == "llama"
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\xff" * 64)
    assert gguf_architecture(junk) is None
    assert gguf_architecture(tmp_path / "missing.gguf") is None


def test_explain_says_which_drafter_a_stream_would_use() -> None:
    from eliza_backends import explain

    report = explain(MTP_BUNDLE, backend="llama.cpp")
    assistant = next((MTP_BUNDLE / "text" / "draft").rglob("*.gguf"))
    assert report.drafters["mtp"].startswith(assistant.relative_to(MTP_BUNDLE).as_posix())
    assert report.drafters["model"].startswith("cannot:")
    assert "mtp" in str(report) and report.to_dict()["drafters"] == dict(report.drafters)
    tiny = explain(TINY_BUNDLE, backend="llama.cpp")
    assert tiny.drafters["mtp"].startswith("cannot:") and "MTP assistant" in tiny.drafters["mtp"]


@pytest.mark.parametrize("flash", ["on", "off"])
@pytest.mark.parametrize("cache", ["f16", "f32"])
def test_mtp_reads_the_target_cache_in_every_layout(ctx: InferenceContext, flash: str,
                                                    cache: str) -> None:
    """The assistant reads the target's KV cache, whose layout (V transposed without flash
    attention) and element type it must share: both contexts get the same settings, and the
    drafts are as good in each."""
    options = {"llama.cpp": {"flash_attention": flash, "kv_cache_type": cache}}
    plain, _, _ = _run(ctx, PROMPTS[0], max_tokens=32, ignore_eos=True, options=options)
    out, drafted, accepted = _run(ctx, PROMPTS[0], max_tokens=32, ignore_eos=True,
                                  drafter="mtp", draft_length=3, draft_policy="fixed",
                                  options=options)
    assert out == plain and drafted > 0 and accepted / drafted >= 0.5


def test_two_mtp_sessions_on_one_context_stay_apart(ctx: InferenceContext) -> None:
    """Each session's assistant reads its own session's context (the weights are shared):
    two sessions stepped in turn give each its own plain greedy tokens."""
    expected = [_run(ctx, p, max_tokens=24, ignore_eos=True)[0] for p in PROMPTS[:2]]
    cfg = {**BASE, "max_tokens": 24, "ignore_eos": True, "drafter": "mtp", "draft_length": 3}
    with open_stream(ctx, backend="llama.cpp", **cfg) as a, \
            open_stream(ctx, backend="llama.cpp", **cfg) as b:  # type: ignore[arg-type]
        a.prefill(PROMPTS[0])
        b.prefill(PROMPTS[1])
        got: list[list[int]] = [[], []]
        done = [False, False]
        while not all(done):
            for i, s in enumerate((a, b)):
                if not done[i]:
                    step = s.session.next()
                    got[i] += step.tokens
                    done[i] = step.final
    assert got == expected


def test_an_interrupt_anywhere_inside_an_mtp_step_loses_nothing(ctx: InferenceContext) -> None:
    """KeyboardInterrupt at the k-th line executed in the plugin or the core's loop (the
    interrupt tests' fuzzer), across a whole drafted next() and prefill(): the history is
    what the caller saw and the stream goes on with the plain greedy tokens, still drafting
    (the staged hidden rows are rewound with the sequence)."""
    from test_interrupts import Injector, _continue, _points

    step, steps = 4, 6
    cfg = {**BASE, "max_tokens": step * steps + 8, "ignore_eos": True, "drafter": "mtp",
           "draft_length": 3, "draft_policy": "fixed"}
    with open_stream(ctx, backend="llama.cpp", **cfg) as s:  # type: ignore[arg-type]
        prompt = s.session.tokenize(PROMPTS[1], add_special=True)
        s.prefill(prompt)
        ref = [t for _ in range(steps) for t in s.session.next(step).tokens]
        s.session.reset()
        with Injector() as count_prefill:
            s.prefill(prompt)
        s.session.next(step)
        with Injector() as count_next:
            s.session.next(step)
    fired = 0
    for phase, count in (("next", count_next.count), ("prefill", count_prefill.count)):
        for k in _points(count, 12):
            with open_stream(ctx, backend="llama.cpp", **cfg) as stream:  # type: ignore
                session = stream.session
                got: list[int] = []
                if phase == "next":
                    session.prefill(prompt)
                    got = list(session.next(step).tokens)
                try:
                    with Injector(k):
                        if phase == "next":
                            got += session.next(step).tokens
                        else:
                            session.prefill(prompt)
                except KeyboardInterrupt:
                    fired += 1
                    assert list(session.history) == (prompt + got if phase == "next" else [])
                    if phase == "prefill":
                        session.prefill(prompt)
                assert _continue(session, got, len(prompt), ref) == "same"
                assert session.next(step).drafted > 0  # still drafting after the repair
    assert fired > 0


def test_an_assistant_over_another_architecture_is_refused(tmp_path: Path) -> None:
    """The assistant reuses its target's last KV layers: over a target of another architecture
    (the tiny llama bundle) it is a BundleError before any context reads a foreign cache."""
    import shutil

    bundle = tmp_path / "mixed"
    (bundle / "text" / "draft" / "mtp").mkdir(parents=True)
    shutil.copy(next((TINY_BUNDLE / "text").glob("*.gguf")), bundle / "text")
    shutil.copy(next((MTP_BUNDLE / "text" / "draft").rglob("*.gguf")),
                bundle / "text" / "draft" / "mtp")
    with pytest.raises(BundleError, match="assists gemma4 models"):
        open_stream(bundle, backend="llama.cpp", threads=1, drafter="mtp")
