"""Validated, immutable stream configuration.

:class:`StreamConfig` is everything a backend needs to open a session: context and batch sizes,
threads, the generation budget, stop strings, sampling, the drafter, and per-backend options.
It is a :class:`~eliza_backends.frozen_model.FrozenModel` (declared as a pydantic model is;
well-typed input is validated without importing pydantic, anything else by the pydantic model
of the same fields): invalid values raise :class:`~eliza_backends.errors.InvalidArgumentError`
with one line per problem, and ``StreamConfig.build(config, **changes)`` makes a validated,
changed copy.

Sampling defaults to greedy (``temperature=0``): an embedded library should be deterministic
unless asked not to be. A temperature below :data:`GREEDY_TEMPERATURE` (1e-5, vLLM's threshold)
is greedy too: dividing logits by a tinier one overflows (1e-45 and 1e-300 are 0 or denormal as
a float32) and gives NaN/inf probabilities, i.e. junk tokens, on every runtime. The rule lives
here once (:attr:`StreamConfig.greedy`), and every backend reads it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal, TypedDict

from .errors import InvalidArgumentError
from .frozen_model import Field, FrozenModel

DrafterKind = Literal["none", "ngram", "model", "mtp"]

#: Temperatures below this decode greedily (argmax), as temperature 0 does.
GREEDY_TEMPERATURE = 1e-5


class StreamConfig(FrozenModel):
    """How to run one stream. All sizes are in tokens; ``threads`` in OS threads."""

    changed_copy: ClassVar[str] = "StreamConfig.build(config, {name}=...)"

    context_size: int = Field(2048, ge=16, le=1 << 20, description="KV context window, tokens.")
    threads: int | None = Field(
        None, ge=1, le=1024, description="Compute threads; None lets the backend choose."
    )
    batch_size: int = Field(512, ge=1, le=1 << 16, description="Max tokens per prefill chunk.")
    max_tokens: int = Field(
        256, ge=1, description="Max tokens generated after each prefill before the stream ends."
    )
    tokens_per_step: int = Field(
        1, ge=1, le=1 << 20, description="Tokens one next() call produces by default."
    )
    stop: tuple[str, ...] = Field(
        (), description="Stop strings: generation ends before any of them; never emitted."
    )
    ignore_eos: bool = Field(False, description="Keep generating past end-of-generation tokens.")

    temperature: float = Field(0.0, ge=0.0, le=100.0, description="0 (or anything below "
                               "GREEDY_TEMPERATURE, 1e-5) means greedy decoding.")
    top_k: int = Field(0, ge=0, description="Keep the k most likely tokens; 0 disables.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass; 1 disables.")
    min_p: float = Field(0.0, ge=0.0, le=1.0, description="Min prob. relative to top; 0 off.")
    repeat_penalty: float = Field(1.0, gt=0.0, le=10.0, description="1 disables.")
    repeat_last_n: int = Field(64, ge=0, description="Window the repeat penalty looks back on.")
    seed: int = Field(0, ge=0, lt=1 << 32, description="Sampler seed (used when temperature > 0).")

    drafter: DrafterKind = Field(
        "none", description="Speculative drafter: none, ngram (prompt lookup), model (a smaller "
        "draft model from text/draft/), mtp (the target's multi-token-prediction assistant from "
        "text/draft/, Gemma 4's; llama.cpp).")
    draft_length: int = Field(4, ge=1, le=64, description="Tokens drafted per speculative step "
                              "(with draft_policy='auto': the most).")
    draft_policy: Literal["auto", "fixed"] = Field(
        "auto", description="auto: the draft length per round (0: no drafting) from this host's "
        "measured verify cost and the acceptance so far, where the backend can measure that "
        "cost (llama.cpp); fixed: always draft_length.")
    ngram_size: int = Field(3, ge=1, le=16, description="Longest n-gram the drafter matches.")
    draft_model: str | None = Field(
        None,
        description="Draft artifact path relative to the bundle, for drafter 'model' or 'mtp' "
        "(default: the bundle's first text/draft/ artifact of that kind for the chosen backend).",
    )

    chat_template: str | None = Field(
        None, description="Jinja chat template to use instead of the model's own.")
    media: frozenset[Literal["image", "audio"]] = Field(
        frozenset(), description="Media kinds the stream must take (image, audio): opening "
        "refuses, before any load, a backend that cannot take them on this bundle.")

    response_format: Mapping[str, Any] | None = Field(
        None, description="OpenAI-style output format: {'type': 'json_object'} or "
        "{'type': 'json_schema', 'json_schema': {'name': ..., 'schema': {...}}}.")
    json_schema: Mapping[str, Any] | bool | None = Field(
        None, description="Generated text is JSON valid against this schema (True: any object).")
    regex: str | None = Field(None, description="Generated text matches this regular expression.")
    grammar: str | None = Field(
        None, description="Generated text follows this grammar (llguidance Lark, or GBNF).")
    logprobs: bool = Field(False, description="Report each generated token's logprob in Step.")
    top_logprobs: int = Field(
        0, ge=0, le=20, description="Alternatives reported per token (implies logprobs).")

    options: Mapping[str, Mapping[str, Any]] = Field(
        default_factory=dict,
        description="Per-backend options keyed by backend name, validated by that backend.",
    )

    @classmethod
    def normalize(cls, data: dict[str, Any]) -> dict[str, Any]:
        """One stop string may be given as a plain string."""
        if isinstance(data.get("stop"), str):
            data = {**data, "stop": (data["stop"],)}
        return data

    def check(self) -> None:
        """The rules between fields (the output constraint is compiled, no vocabulary yet)."""
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")
        if self.batch_size > self.context_size:
            raise ValueError(
                f"batch_size ({self.batch_size}) cannot exceed context_size ({self.context_size})"
            )
        if self.draft_model is not None and self.drafter not in ("model", "mtp"):
            raise ValueError("draft_model is only used with drafter='model' or 'mtp'")
        constraints = [name for name in ("response_format", "json_schema", "regex", "grammar")
                       if getattr(self, name) is not None]
        if len(constraints) > 1:
            raise ValueError(f"set one output constraint, not {' and '.join(constraints)}")
        if constraints:
            from .structured.logits import OutputSpec

            try:  # checks the shapes and that the constraint compiles (no vocabulary yet)
                spec = OutputSpec.from_config(self)
            except InvalidArgumentError as exc:
                raise ValueError(exc.message) from None
            if spec.constraint is not None and self.ignore_eos:
                raise ValueError("ignore_eos cannot be used with an output constraint (the "
                                 "constraint ends the text with an end token)")

    @property
    def greedy(self) -> bool:
        """True when sampling reduces to argmax: a temperature below
        :data:`GREEDY_TEMPERATURE` (0 included), or top_k 1."""
        return self.temperature < GREEDY_TEMPERATURE or self.top_k == 1

    @classmethod
    def build(cls, config: StreamConfig | Mapping[str, Any] | None = None,
              **overrides: Any) -> StreamConfig:
        """Make a config from a config, a mapping and/or keyword overrides (validated)."""
        base: dict[str, Any] = {}
        if isinstance(config, StreamConfig):
            base = config.model_dump()
        elif config is not None:
            base = dict(config)
        base.update(overrides)
        return cls(**base)


class StreamOverrides(TypedDict, total=False):
    """The keyword overrides ``open_stream(bundle, **overrides)`` takes: the fields of
    :class:`StreamConfig`, typed so that editors complete them and type checkers check them
    (``**overrides: Unpack[StreamOverrides]``). Validation is still :class:`StreamConfig`'s."""

    context_size: int
    threads: int | None
    batch_size: int
    max_tokens: int
    tokens_per_step: int
    stop: str | Sequence[str]
    ignore_eos: bool
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    repeat_penalty: float
    repeat_last_n: int
    seed: int
    drafter: DrafterKind
    draft_length: int
    draft_policy: Literal["auto", "fixed"]
    ngram_size: int
    draft_model: str | None
    chat_template: str | None
    media: frozenset[Literal["image", "audio"]] | Sequence[Literal["image", "audio"]]
    response_format: Mapping[str, Any] | None
    json_schema: Mapping[str, Any] | bool | None
    regex: str | None
    grammar: str | None
    logprobs: bool
    top_logprobs: int
    options: Mapping[str, Mapping[str, Any]]


__all__ = ["GREEDY_TEMPERATURE", "DrafterKind", "StreamConfig", "StreamOverrides"]
