"""The logits hook: what the core does to the next-token logits before a backend samples.

A backend whose runtime hands it the next-token logits (``Capabilities.logits``) calls the
session's :class:`LogitsGuide` (the helper ``Session._guide``; None when the turn asks for
nothing, so the hot path pays one attribute test per step) at each sampling point::

    row = guide.process(row)   # 1-D float32 logits: logprobs read, disallowed ids set to -inf
    token = <the backend's own sampler on row>
    guide.accept(token)

``process`` changes ``row`` in place (and returns it), so a runtime whose sampler reads the
logits from its own buffer (llama.cpp's ``llama_get_logits_ith``) samples the masked values
with its own sampler chain; a runtime that samples from arrays (LiteRT's numpy sampler, MLX)
samples the returned row. ``prepare()`` computes the mask ahead, e.g. while the runtime's
forward pass runs asynchronously (MLX).

What a turn asks for is an :class:`OutputSpec` (a constraint, logprobs): the config's by
default (:meth:`OutputSpec.from_config`), or one set per turn with ``Session.set_output``. The
base class builds a fresh guide at each prefill and collects the logprobs into each ``Step``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import InvalidArgumentError

if TYPE_CHECKING:  # the constraint and logprob modules: imported by a turn that uses them
    import numpy as np

    from .constraint import Constraint, TokenVocabulary
    from .logprobs import RawLogprob


class OutputFields(Protocol):
    """The fields an :class:`OutputSpec` is read from (a
    :class:`~eliza_backends.config.StreamConfig` has them; this package sits below the config
    and does not import it)."""

    @property
    def response_format(self) -> Mapping[str, Any] | None: ...
    @property
    def json_schema(self) -> Mapping[str, Any] | bool | None: ...
    @property
    def regex(self) -> str | None: ...
    @property
    def grammar(self) -> str | None: ...
    @property
    def logprobs(self) -> bool: ...
    @property
    def top_logprobs(self) -> int: ...


@dataclass(frozen=True)
class OutputSpec:
    """What one turn's generated tokens must satisfy and report: ``constraint`` (None: any
    text), ``logprobs`` (each token's logprob in ``Step.logprobs``) and ``top_logprobs`` (that
    many alternatives per token, 0..20; implies ``logprobs``). A constraint that does not
    compile is an :class:`InvalidArgumentError` here, before any session work."""

    constraint: Constraint | None = None
    logprobs: bool = False
    top_logprobs: int = 0

    def __post_init__(self) -> None:
        if type(self.top_logprobs) is not int or self.top_logprobs != 0:  # (0: the default)
            from .logprobs import MAX_TOP_LOGPROBS

            if isinstance(self.top_logprobs, bool) or not isinstance(self.top_logprobs, int) \
                    or not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
                raise InvalidArgumentError(f"top_logprobs must be an int in 0.."
                                           f"{MAX_TOP_LOGPROBS}, got {self.top_logprobs!r}")
        if self.constraint is not None:
            from .constraint import Constraint, check_compiles

            if not isinstance(self.constraint, Constraint):
                raise InvalidArgumentError(
                    "constraint must be a Constraint (Constraint.json_schema(...), .regex(...), "
                    f".grammar(...)), got {type(self.constraint).__name__}")
            check_compiles(self.constraint)

    @property
    def active(self) -> bool:
        """True when the turn needs the logits hook at all."""
        return self.constraint is not None or self.logprobs or self.top_logprobs > 0

    @classmethod
    def from_config(cls, config: OutputFields) -> OutputSpec:
        """The spec of ``config``'s ``response_format`` / ``json_schema`` / ``regex`` /
        ``grammar`` and ``logprobs`` / ``top_logprobs`` fields."""
        constraint: Constraint | None = None
        asked = (config.response_format, config.json_schema, config.regex, config.grammar)
        if any(field is not None for field in asked):
            from .constraint import Constraint
        if config.response_format is not None:
            constraint = Constraint.from_response_format(config.response_format)
        elif config.json_schema is not None:
            constraint = Constraint.json_schema(config.json_schema)
        elif config.regex is not None:
            constraint = Constraint.regex(config.regex)
        elif config.grammar is not None:
            constraint = Constraint.grammar(config.grammar)
        return cls(constraint, config.logprobs, config.top_logprobs)


class LogitsGuide:
    """One turn's logits processing: the constraint's mask and the logprob recorder. Owned by
    the session's base class; backends call :meth:`process` / :meth:`accept` (and may call
    :meth:`prepare`) on the consumer thread."""

    def __init__(self, spec: OutputSpec, vocabulary: TokenVocabulary | None) -> None:
        import numpy as np

        from .constraint import ConstraintMatcher
        from .logprobs import LogprobRecorder

        self._np = np
        self.spec = spec
        self.matcher = ConstraintMatcher(spec.constraint, vocabulary) \
            if spec.constraint is not None and vocabulary is not None else None
        self.recorder = LogprobRecorder(spec.top_logprobs) \
            if spec.logprobs or spec.top_logprobs else None
        self._size = vocabulary.size if vocabulary is not None else 0

    def prepare(self) -> None:
        """Compute the next mask now (e.g. while the runtime computes the logits)."""
        if self.matcher is not None:
            self.matcher.fill_mask()

    def process(self, row: np.ndarray) -> np.ndarray:
        """Record what logprobs need from the raw ``row`` (1-D float32 logits of the next
        token), then set every id the constraint forbids (and any padding past the
        vocabulary) to -inf, in place. Returns ``row``."""
        if self.recorder is not None:
            self.recorder.observe(row)
        if self.matcher is not None:
            np = self._np
            allowed = self.matcher.fill_mask()
            n = self._size
            np.putmask(row[:n], ~allowed, -np.inf)
            if row.shape[0] > n:
                row[n:] = -np.inf
        return row

    def accept(self, token: int) -> None:
        """The token sampled from the row last processed."""
        if self.recorder is not None:
            self.recorder.record(token)
        if self.matcher is not None:
            self.matcher.consume(token)

    def valid_drafts(self, drafts: list[int]) -> list[int]:
        """The prefix of ``drafts`` the constraint allows from the current state."""
        if self.matcher is None or not drafts:
            return drafts
        return drafts[:self.matcher.valid_prefix(drafts)]

    def take_logprobs(self, n: int) -> list[RawLogprob] | None:
        """The logprobs of the next ``n`` accepted tokens (None when none were asked for)."""
        return self.recorder.take(n) if self.recorder is not None else None


__all__ = ["LogitsGuide", "OutputSpec"]
