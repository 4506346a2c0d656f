"""Where a batched greedy reply may differ from the same request served alone.

llama.cpp's batched matrix kernels add in another order than single-sequence ones, so a
sequence decoded in a batch gets logits that differ from its solo logits in the last bits; at a
near-tie (top-1 and top-2 within a few thousandths of a nat) greedy decoding can then take the
other token. :func:`divergence_gap` finds the first token where ``got`` leaves the solo reply
and returns the solo top-1/top-2 logprob gap there: a divergence at a near-tie is rounding, one
at a clear winner is a bug.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from eliza_backends import InferenceContext, chat_completion, completion

#: A top-1/top-2 logprob gap (nats) under which batched rounding may flip the greedy choice.
NEAR_TIE = 0.01


Prompt = str | Sequence[int] | Sequence[Mapping[str, Any]]


def divergence_gap(target: str | os.PathLike[str] | InferenceContext, prompt: Prompt,
                   got: str, *, max_tokens: int, config: Mapping[str, Any]) -> float | None:
    """The solo top-1/top-2 gap at the first token where ``got`` leaves the solo greedy reply
    (None when ``got`` is the solo reply or a prefix-consistent continuation of it)."""
    if not (isinstance(prompt, list) and prompt and isinstance(prompt[0], Mapping)):
        lp = completion(target, prompt, max_tokens=max_tokens,  # type: ignore[arg-type]
                        config=config, logprobs=2).choices[0].logprobs
        assert lp is not None
        steps = [(tok, sorted(tops.values(), reverse=True))
                 for tok, tops in zip(lp.tokens, lp.top_logprobs or [], strict=True)]
    else:
        reply = chat_completion(target, prompt, max_tokens=max_tokens,  # type: ignore[arg-type]
                                config=config,
                                logprobs=True, top_logprobs=2)
        content = reply.choices[0].logprobs
        assert content is not None and content.content is not None
        steps = [(e.token, sorted((t.logprob for t in e.top_logprobs), reverse=True))
                 for e in content.content]
    text = ""
    for token, tops in steps:
        if not got.startswith(text + token):
            return tops[0] - tops[1] if len(tops) > 1 else float("inf")
        text += token
    return None


def assert_same_or_near_tie(target: str | os.PathLike[str] | InferenceContext,
                            prompts: Sequence[Prompt], got: Sequence[str], want: Sequence[str],
                            *, max_tokens: int, config: Mapping[str, Any],
                            at_most: int | None = None) -> list[int]:
    """Every ``got[i]`` equals ``want[i]`` (the solo reply to ``prompts[i]``) or leaves it at a
    near-tie; at most ``at_most`` (default: a quarter, at least 1) may leave it. Returns the
    indexes that did."""
    assert len(got) == len(want) == len(prompts)
    flipped = []
    for i, (prompt, g, w) in enumerate(zip(prompts, got, want, strict=True)):
        if g != w:
            gap = divergence_gap(target, prompt, g, max_tokens=max_tokens, config=config)
            assert gap is not None and gap < NEAR_TIE, (i, g, w, gap)
            flipped.append(i)
    limit = max(1, len(got) // 4) if at_most is None else at_most
    assert len(flipped) <= limit, flipped
    return flipped


__all__ = ["NEAR_TIE", "assert_same_or_near_tie", "divergence_gap"]
