"""The draft policy: its arithmetic, its decisions on given cost curves, and on the real loop
(greedy output unchanged, the cost curve measured once per loaded model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eliza_backends import InferenceContext, open_stream
from eliza_backends.runtime.draft_policy import DraftPolicy, expected_yield, speedup_bound
from eliza_backends.runtime.speculative import NgramDrafter, speculate

TINY_BUNDLE = Path(__file__).resolve().parent.parent / "examples" / "bundles" / "tiny"
ORACLE = json.loads((TINY_BUNDLE / "oracle.json").read_text())
#: SmolLM2-135M Q4_1 on this CPU at 2 threads (benchmarks/bench_verify_cost.py shape): a forward
#: pass over n tokens relative to one, n = 1..5
CPU_CURVE = [0.015, 0.0234, 0.0324, 0.0389, 0.0489]


def test_expected_yield_is_the_geometric_sum() -> None:
    assert expected_yield(0.0, 4) == 1.0
    assert expected_yield(1.0, 4) == 5.0
    assert expected_yield(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    assert speedup_bound(0.5, 2, [1.0, 1.0, 1.0]) == pytest.approx(1.75)
    assert speedup_bound(0.5, 2, [1.0, 1.5, 2.0], draft_cost=0.25) == pytest.approx(1.75 / 2.5)


def test_a_compute_bound_curve_needs_high_acceptance() -> None:
    """On a curve where each extra token costs ~0.6 of a decode, the prior of 0.5 does not pay,
    so drafting starts off; high observed acceptance turns it on, a run of rejections off."""
    p = DraftPolicy(CPU_CURVE, 4, cheap_drafter=True)
    assert p.k == 0 and p.next_length() == 0 and p.shadow()
    for _ in range(30):
        p.observe(1, 1)  # shadow rounds: the drafter's token was the produced one
    assert p.acceptance > 0.9 and p.k >= 1 and not p.shadow()
    for _ in range(40):
        p.observe(p.k, 0)
    assert p.k == 0


def test_a_flat_curve_drafts_the_most() -> None:
    p = DraftPolicy([0.01] * 9, 8, cheap_drafter=True)
    assert p.k >= 4  # extra positions are free: long drafts pay at the prior's acceptance
    assert DraftPolicy([0.01] * 3, 8, cheap_drafter=True).max_k == 2  # cut to the curve


def test_a_cheaper_longer_batch_is_preferred() -> None:
    """Gemma 3 270M Q4_K_M at 1 thread (ggml's repacked matmuls take rows in groups): a 4-token
    batch costs less than a 3-token one, so 3 drafts beat 2 at any acceptance, and at a high one
    they beat 4 drafts (a 5-token batch)."""
    gemma = [1.0, 2.45, 4.27, 3.06, 4.57]
    p = DraftPolicy(gemma, 4, cheap_drafter=True)
    for _ in range(60):
        p.observe(1, 1)
    assert p.acceptance > 0.95 and p.k == 3
    assert speedup_bound(p.acceptance, 3, p.cost) > speedup_bound(p.acceptance, 2, p.cost)


def test_the_curve_follows_the_rounds_own_times() -> None:
    """A measurement that made batches look cheap is corrected by the rounds: when every batch
    costs 1.5 decodes a token, drafting at the prior's acceptance stops; when plain rounds turn
    out twice as slow as measured, the same batches pay and drafting starts."""
    p = DraftPolicy([0.01, 0.0105, 0.011, 0.0115, 0.012], 4, cheap_drafter=True)
    first = p.k
    assert first >= 3
    for _ in range(60):
        n = p.k + 1
        p.observe_round(n, 0.01 if n == 1 else 0.015 * n)
    assert p.k == 0 and p.cost[first] > 1.5 * p.measured_cost[first]
    assert p.measured_cost[3] == pytest.approx(1.15)  # what the backend measured, kept
    q = DraftPolicy([0.01, 0.02, 0.03, 0.04, 0.05], 4, cheap_drafter=True)
    assert q.k == 0
    for _ in range(20):
        q.observe_round(1, 0.02)
    assert q.k >= 1 and q.cost[1] == pytest.approx(1.0, rel=0.01)


def test_a_costly_drafter_is_probed_while_off() -> None:
    p = DraftPolicy(CPU_CURVE, 4, cheap_drafter=False, probe_every=4)
    assert p.k == 0 and not p.shadow()
    lengths = [p.next_length() for _ in range(8)]
    assert lengths == [0, 0, 0, 1, 0, 0, 0, 1]
    p.observe_drafting(0.03, 1)  # drafting a token costs two decodes: never worth it
    for _ in range(30):
        p.observe(1, 1)
    assert p.draft_cost == pytest.approx(2.0) and p.k == 0


def test_speculate_with_the_policy_off_is_plain_rounds() -> None:
    """k = 0: every round verifies no drafts (one token), the n-gram drafter is only asked for
    a one-token shadow proposal, and the output is the verify's own."""
    calls: list[list[int]] = []

    def verify(seq: list[int], drafts: list[int]) -> tuple[list[int], int]:
        calls.append(list(drafts))
        return [len(seq) % 7], 0

    p = DraftPolicy(CPU_CURVE, 4, cheap_drafter=True, prior=0.0)
    out, drafted, accepted = speculate(NgramDrafter(), [1, 2, 3, 1, 2], 10, 4, verify,
                                       lambda t: False, lambda: None, p)
    assert len(out) == 10 and drafted == accepted == 0 and calls == [[]] * 10


def test_auto_policy_keeps_greedy_output_and_measures_once() -> None:
    pytest.importorskip("llama_cpp")
    case = ORACLE["prompts"][0]
    n = len(case["continuation_ids"])
    with InferenceContext(TINY_BUNDLE) as ctx:
        curves = []
        for _ in range(2):
            with open_stream(ctx, backend="llama.cpp", threads=1, max_tokens=n,
                             ignore_eos=True, drafter="ngram", draft_length=4) as s:
                s.prefill(case["prompt_ids"])
                assert [t for st in s for t in st.tokens] == case["continuation_ids"]
                policy = s.session.draft_policy
                assert policy is not None and policy.max_k == 4
                assert len(policy.cost) == 5 and policy.cost[0] == 1.0
                assert min(policy.cost) == 1.0  # relative to one token, never below it
                curves.append(policy.measured_cost)
        assert curves[0] == curves[1]  # measured once for the loaded model
        with open_stream(ctx, backend="llama.cpp", threads=1, max_tokens=4, ignore_eos=True,
                         drafter="ngram", draft_policy="fixed") as s:
            s.prefill(case["prompt_ids"])
            s.text()
            assert s.session.draft_policy is None
