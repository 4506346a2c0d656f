"""Gemma 4's MTP assistant as the MLX drafter (``drafter="mtp"``): mlx-vlm's assistant as the
draft forward pass, the core's one speculative loop, on the tiny Gemma 4 pair (mlx-lm target,
mlx-vlm assistant, f32).

Greedy output equals plain greedy output (on every oracle prompt, past the sliding window
too); acceptance is within 0.05 of the llama.cpp seam's on the same prompts and draft length;
rewinds (reset, reset_keep, slots, cancel) keep target and assistant in step; the factory
reports the drafter and refuses what it cannot run with typed errors. Full tier only.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, TINY_BUNDLE
from mtp_rewinds import check_mtp_rewinds

pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")
pytest.importorskip("mlx_vlm")

from eliza_mlx import MLXFactory

from eliza_backends import (
    BundleError,
    Factory,
    InferenceContext,
    UnsupportedOperationError,
    explain,
    open_stream,
)
from eliza_backends.testing import SpeculativeChecks, generated_tokens, run_to_end

MTP_BUNDLE = ROOT / "examples" / "bundles" / "gemma4-tiny"
ORACLE = json.loads((MTP_BUNDLE / "oracle.json").read_text())["prompts"]
BASE: dict[str, Any] = {"threads": 1, "context_size": 1024, "batch_size": 64}
MTP: dict[str, Any] = {"drafter": "mtp", "draft_policy": "fixed"}


@pytest.fixture(scope="module")
def ctx() -> InferenceContext:
    with InferenceContext(MTP_BUNDLE) as c:
        yield c


def _run(ctx: InferenceContext, backend: str, prompt: list[int] | str,
         **config: Any) -> tuple[list[int], int, int]:
    with open_stream(ctx, backend=backend, **{**BASE, **config}) as s:
        s.prefill(prompt)
        steps = run_to_end(s.session)
    for st in steps:
        assert 0 <= st.accepted <= st.drafted
    return (generated_tokens(steps), sum(st.drafted for st in steps),
            sum(st.accepted for st in steps))


def test_mtp_equals_plain_greedy_with_llama_cpp_acceptance(ctx: InferenceContext) -> None:
    """Every oracle prompt (training text, unseen text, chat, 160 and 400 tokens: past the
    32-token sliding window): MLX with the MTP assistant gives the plain greedy tokens (and the
    oracle's), drafts, and its acceptance is within 0.05 of the llama.cpp seam's on the same
    prompts and draft length, measured here side by side (0.6858 and 0.6842 at k=3)."""
    totals = {"mlx": [0, 0], "llama.cpp": [0, 0]}
    for case in ORACLE:
        n = len(case["continuation_ids"])
        plain, _, _ = _run(ctx, "mlx", case["prompt_ids"], max_tokens=n, ignore_eos=True)
        assert plain == case["continuation_ids"], case["name"]
        for backend, total in totals.items():
            out, drafted, accepted = _run(ctx, backend, case["prompt_ids"], max_tokens=n,
                                          ignore_eos=True, draft_length=3, **MTP)
            assert out == plain, (backend, case["name"])
            assert drafted > 0, (backend, case["name"])
            total[0] += drafted
            total[1] += accepted
    rate = {backend: a / d for backend, (d, a) in totals.items()}
    assert abs(rate["mlx"] - rate["llama.cpp"]) <= 0.05, (totals, rate)
    assert rate["mlx"] >= 0.5, totals  # the trained assistant: mostly accepted


@pytest.mark.parametrize("k", [1, 4, 8])
def test_mtp_greedy_at_other_draft_lengths(ctx: InferenceContext, k: int) -> None:
    for case in (ORACLE[0], ORACLE[8], ORACLE[-1]):
        plain, _, _ = _run(ctx, "mlx", case["prompt_ids"], max_tokens=40, ignore_eos=True)
        out, drafted, _ = _run(ctx, "mlx", case["prompt_ids"], max_tokens=40, ignore_eos=True,
                               draft_length=k, **MTP)
        assert out == plain and drafted > 0, (k, case["name"])


def test_mtp_past_the_sliding_window_and_with_the_auto_policy(ctx: InferenceContext) -> None:
    """A long generation (the KV the assistant reads grows past the window), and the auto
    draft policy (which may skip drafting): still the plain greedy tokens."""
    prompt = "Four score and seven years ago. The river does not hurry. Ships that passed"
    plain, _, _ = _run(ctx, "mlx", prompt, max_tokens=120, ignore_eos=True)
    for policy in ("fixed", "auto"):
        out, drafted, _ = _run(ctx, "mlx", prompt, max_tokens=120, ignore_eos=True,
                               drafter="mtp", draft_length=3, draft_policy=policy)
        assert out == plain, policy
        assert policy == "auto" or drafted > 0


def test_mtp_chat_turn_and_end_tokens(ctx: InferenceContext) -> None:
    """A chat turn through the template, stopping at the model's own end token."""
    messages = [{"role": "user", "content": "What is two plus two?"}]
    with open_stream(ctx, backend="mlx", **BASE, max_tokens=40) as s:
        s.prefill_messages(messages)
        plain = generated_tokens(run_to_end(s.session))
    with open_stream(ctx, backend="mlx", **BASE, max_tokens=40, draft_length=3, **MTP) as s:
        s.prefill_messages(messages)
        steps = run_to_end(s.session)
    assert generated_tokens(steps) == plain
    assert sum(st.accepted for st in steps) > 0


def test_mtp_rewinds_keep_target_and_assistant_in_step(ctx: InferenceContext,
                                                      tmp_path: Path) -> None:
    """reset_keep, reset, slots, cancel (tests/mtp_rewinds.py, as on llama.cpp)."""
    check_mtp_rewinds(ctx, "mlx", ORACLE[0]["prompt_ids"], BASE, tmp_path)


def test_ngram_past_the_sliding_window(ctx: InferenceContext) -> None:
    """A speculative session keeps full-length caches, so rounds are rolled back past the
    sliding window too (a ring buffer cannot be trimmed once full)."""
    case = ORACLE[-1]  # 400 tokens
    plain, _, _ = _run(ctx, "mlx", case["prompt_ids"], max_tokens=48, ignore_eos=True)
    out, drafted, _ = _run(ctx, "mlx", case["prompt_ids"], max_tokens=48, ignore_eos=True,
                           drafter="ngram", draft_length=4, draft_policy="fixed")
    assert out == plain and drafted > 0


def test_sampling_with_mtp_is_refused(ctx: InferenceContext) -> None:
    with pytest.raises(UnsupportedOperationError, match="greedy-only"):
        open_stream(ctx, backend="mlx", temperature=0.8, drafter="mtp")


def test_mtp_without_an_assistant_is_a_bundle_error() -> None:
    with pytest.raises(BundleError, match="MTP assistant"):
        open_stream(TINY_BUNDLE, backend="mlx", drafter="mtp")


def test_draft_model_path_must_be_the_targets_assistant(ctx: InferenceContext) -> None:
    with pytest.raises(BundleError, match="not an MTP assistant"):
        open_stream(ctx, backend="mlx", drafter="mtp", draft_model="text/gemma4-tiny-mlx")


def test_an_assistant_of_another_size_is_refused(tmp_path: Path) -> None:
    """An assistant whose backbone width is not the target's hidden size: a BundleError at
    open, and explain says so, before mlx-vlm loads anything."""
    bundle = tmp_path / "bundle"
    (bundle / "text" / "draft" / "mtp").mkdir(parents=True)
    for name in ("gemma4-tiny-mlx", "draft/mtp/gemma4-tiny-assistant-mlx"):
        src = MTP_BUNDLE / "text" / name
        dest = bundle / "text" / name
        dest.mkdir()
        for f in src.iterdir():
            (dest / f.name).symlink_to(f)
    config = bundle / "text" / "draft" / "mtp" / "gemma4-tiny-assistant-mlx" / "config.json"
    data = json.loads(config.read_text())
    config.unlink()
    config.write_text(json.dumps({**data, "backbone_hidden_size": 256}))
    with pytest.raises(BundleError, match="hidden states of width 256"):
        open_stream(bundle, backend="mlx", drafter="mtp")
    assert "width 256" in MLXFactory().drafters(bundle)["mtp"]


def test_drafters_and_explain_report_the_mlx_mtp_drafter() -> None:
    """Factory.drafters() and explain (select --explain) name the assistant's MLX folder,
    with no runtime imported (folder probes only)."""
    drafters = MLXFactory().drafters(MTP_BUNDLE)
    assert drafters["mtp"].startswith("text/draft/mtp/gemma4-tiny-assistant-mlx (")
    assert drafters["model"].startswith("cannot:")
    assert MLXFactory().drafters(TINY_BUNDLE)["mtp"].startswith("cannot:")
    code = ("import sys, eliza_backends as e; r = e.explain(sys.argv[1], backend='mlx'); "
            "print(r.drafters['mtp']); "
            "print([m for m in ('mlx', 'mlx_lm', 'mlx_vlm', 'transformers') "
            "if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code, str(MTP_BUNDLE)], capture_output=True,
                         text=True, check=True, timeout=300)
    line, loaded = out.stdout.strip().splitlines()
    assert line.startswith("text/draft/mtp/gemma4-tiny-assistant-mlx") and loaded == "[]"
    assert "gemma4-tiny-assistant-mlx" in str(explain(MTP_BUNDLE, backend="mlx"))


class TestMlxMtpSpeculativeKit(SpeculativeChecks):
    """The conformance kit's speculative checks with MLX on the Gemma 4 pair: every drafter the
    session offers (n-gram, MTP; 'model' finds no draft model here) keeps greedy output."""

    @pytest.fixture
    def factory(self) -> Factory:
        return MLXFactory()

    @pytest.fixture
    def bundle_dir(self) -> Path:
        return MTP_BUNDLE


def test_the_bundle_assistant_folder_is_the_converters_output(tmp_path: Path) -> None:
    """text/draft/mtp/gemma4-tiny-assistant-mlx is what the converter's Gemma 4 family
    writes from the assistant's Hugging Face folder (source/assistant) and the target's."""
    from eliza_backends.convert.families.gemma4 import FAMILY

    out = tmp_path / "assistant-mlx"
    FAMILY.write_mlx_draft(MTP_BUNDLE / "source" / "assistant",
                           MTP_BUNDLE / "text" / "gemma4-tiny-mlx", out)
    committed = MTP_BUNDLE / "text" / "draft" / "mtp" / "gemma4-tiny-assistant-mlx"
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in committed.iterdir())
    for made in out.iterdir():
        assert made.read_bytes() == (committed / made.name).read_bytes(), made.name
