"""One turn of a session: from a prefill to the end of the generation that follows it.

A :class:`Turn` holds what a turn has produced and what ends it: whether there are logits to
sample from (``ready``), whether the stream ended (``finished``), the tokens generated against
the budget, the UTF-8 / stop-string :class:`~eliza_backends.runtime.text.TextAssembler` and
the turn's logits guide (constraint, logprobs). :meth:`Turn.assemble` turns what a backend's
``_decode`` hook returned into the :class:`~eliza_backends.backend.types.Step` the caller sees.

The budget (``max_tokens``) and the stop strings are the config's unless
``Session.set_turn`` set others (:func:`turn_settings` checks them); like ``set_output``,
they take effect at the next prefill (:meth:`Turn.apply`) and hold for the turns after it.

Owned by one session and used on its consumer thread only, with the consumer lock held.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ..config import StreamConfig
from ..errors import InvalidArgumentError
from ..runtime.text import AssemblerState, TextAssembler
from ..structured.logits import LogitsGuide, OutputSpec
from .model_info import ModelInfo
from .types import Decoded, FinishReason, Step

if TYPE_CHECKING:  # a turn that asked for logprobs imports it
    from ..structured.logprobs import TokenLogprob


class Turn:
    """The per-turn state of one session (see the module docstring). ``eog``: the ids that
    end generation (ignored with ``config.ignore_eos``)."""

    def __init__(self, config: StreamConfig, eog: frozenset[int]) -> None:
        self.config = config
        self.eog = eog
        self.ready = False  # True when the last prefill left logits to sample from
        self.finished = False
        self.generated = 0
        #: set_turn()'s budget and stop strings (None: the config's), applied at a prefill
        self.settings: tuple[int | None, tuple[str, ...] | None] = (None, None)
        self.max_tokens = config.max_tokens  # this turn's budget
        self.stop = config.stop  # this turn's stop strings
        self.assembler = TextAssembler(self.stop)
        self.guide: LogitsGuide | None = None  # this turn's, built at prefill

    def apply(self) -> None:
        """A prefill starts a turn: its budget and stop strings are the settings'."""
        max_tokens, stop = self.settings
        self.max_tokens = self.config.max_tokens if max_tokens is None else max_tokens
        self.stop = self.config.stop if stop is None else stop

    def start(self) -> None:
        """A prefill succeeded: a fresh turn with logits to sample from."""
        self.assembler = TextAssembler(self.stop)
        self.finished = False
        self.generated = 0
        self.ready = True

    def clear(self) -> None:
        """The sequence was rewound: no turn, nothing to sample from."""
        self.ready = False
        self.finished = False
        self.generated = 0
        self.assembler = TextAssembler(self.stop)
        self.guide = None

    @property
    def budget(self) -> int:
        """Tokens this turn may still generate."""
        return self.max_tokens - self.generated

    def restore(self, before: tuple[int, AssemblerState]) -> None:
        """Undo the steps since ``before`` (``(generated, assembler.state())``, taken by the
        session as a step starts)."""
        self.generated, state = before
        self.assembler.restore(state)
        self.finished = False

    def assemble(self, out: Decoded, budget: int, room: int, history: list[int],
                 piece: Callable[[int], bytes]) -> Step:
        """The step of ``out`` (``budget``: tokens the turn had left, ``room``: free context
        positions, both before it): its tokens join ``history`` (all of them, tokens past an
        end too: they are the KV cache's), its text runs through the assembler, and the first
        end (an end token, a stop string, the budget, the window, the runtime's own) ends it.
        ``piece``: a token's bytes (the session's ``_token_bytes``)."""
        eog = () if self.config.ignore_eos else self.eog
        assembler = self.assembler
        texts: list[str] = []
        kept: list[int] = []
        reason: FinishReason | None = None
        for tok in out.tokens:
            kept.append(tok)
            if tok in eog:
                reason = "eos"
                break
            texts.append(assembler.push(piece(tok)))
            if assembler.stopped:
                reason = "stop"
                break
        history.extend(out.tokens)
        self.generated += len(out.tokens)
        if reason is None and len(out.tokens) >= budget:
            reason = "length"
        elif reason is None and len(out.tokens) >= room:
            reason = "context"
        elif reason is None and out.finish is not None:
            reason = out.finish
        logprobs = None if self.guide is None else self._logprobs(len(out.tokens), len(kept),
                                                                  piece)
        if reason is None:
            return Step(tuple(kept), "".join(texts), out.drafted, out.accepted,
                        logprobs=logprobs)
        if reason != "stop":
            texts.append(assembler.flush())
        return self.finish(tuple(kept), "".join(texts), out.drafted, out.accepted, reason,
                           logprobs)

    def finish(self, tokens: tuple[int, ...], text: str, drafted: int, accepted: int,
               reason: FinishReason, logprobs: tuple[TokenLogprob, ...] | None = None) -> Step:
        """The final step of the turn."""
        self.finished = True
        return Step(tokens, text, drafted, accepted, final=True, finish_reason=reason,
                    logprobs=logprobs)

    def _logprobs(self, produced: int, kept: int, piece: Callable[[int], bytes]
                  ) -> tuple[TokenLogprob, ...] | None:
        assert self.guide is not None
        raw = self.guide.take_logprobs(produced)
        if raw is None:
            return None
        from ..structured.logprobs import TokenLogprob, TopLogprob

        return tuple(TokenLogprob(r.token, piece(r.token), r.logprob,
                                  tuple(TopLogprob(t, piece(t), lp) for t, lp in r.top))
                     for r in raw[:kept])


def new_guide(spec: OutputSpec, info: ModelInfo, piece: Callable[[int], bytes],
              tokenize: Callable[[str, bool, bool], list[int]]) -> LogitsGuide:
    """The logits guide of a turn that asks for ``spec``: over the model's own vocabulary
    (``piece``: the session's ``_token_bytes``; ``tokenize``: its ``_tokenize``, for the
    control tokens a grammar names) when ``spec`` constrains the output."""
    vocabulary = None
    if spec.constraint is not None:
        from ..structured.constraint import model_vocabulary

        def control_id(text: str) -> int | None:
            ids = tokenize(text, False, True)
            return ids[0] if len(ids) == 1 else None

        vocabulary = model_vocabulary(info, piece, control_id)
    return LogitsGuide(spec, vocabulary)


def turn_settings(max_tokens: int | None, stop: str | Sequence[str] | None
                  ) -> tuple[int | None, tuple[str, ...] | None]:
    """``Session.set_turn``'s arguments checked (:class:`InvalidArgumentError` otherwise):
    a positive int budget, and stop strings (one string or a sequence of non-empty ones)."""
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(
            max_tokens, int) or max_tokens < 1):
        raise InvalidArgumentError(f"max_tokens must be a positive int or None, got "
                                   f"{max_tokens!r}")
    if stop is None:
        return max_tokens, None
    stops = (stop,) if isinstance(stop, str) else stop
    if isinstance(stops, bytes) or not isinstance(stops, Sequence) or not all(
            isinstance(s, str) and s for s in stops):
        raise InvalidArgumentError(f"stop must be a non-empty string or a sequence of them, "
                                   f"got {stop!r}")
    return max_tokens, tuple(stops)


__all__ = ["Turn", "new_guide", "turn_settings"]
