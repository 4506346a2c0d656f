"""Constrained decoding: what the output must match, and the token masks that enforce it.

:class:`Constraint` says what the generated text must be: JSON valid against a JSON schema
(``json_schema``; ``{"type": "object"}`` for any object), a regular expression (``regex``), or a
context-free grammar (``grammar``: llguidance's Lark dialect, or GBNF, llama.cpp's grammar
format, converted). It is plain data, validated cheaply; nothing is compiled until a session
generates with it.

:class:`ConstraintMatcher` is one generation's parser state. It is built by the core's logits
guide (:mod:`eliza_backends.structured.logits`) over **the model's own vocabulary**: the bytes each
token contributes to the text, read through the session's ``_token_bytes`` hook, which every backend
answers identically for the same model. The same request therefore gives the same masks, and
with identical weights the same constrained output, on every backend.

The engine is llguidance (``pip install 'eliza-backends[structured]'``), imported on first
use. Why llguidance (measured on this project's two real vocabularies, see the structured
output guide): it compiles a JSON schema in ~2 ms where outlines-core builds a regex index in
0.8 s (SmolLM2, 49k tokens) to 4.5 s (Gemma 3, 262k tokens) per schema; a mask costs a median
of ~50 us (SmolLM2) and ~0.1-1 ms (Gemma 3); it does regex, JSON schema and Lark/GBNF grammars
(outlines-core: regex and JSON only); and it needs no torch (xgrammar 0.2 requires torch and
triton at install).

The vocabulary object (an llguidance ``LLTokenizer``) costs 0.3 s (49k tokens) to 2.5 s (262k)
to build, so it is made once per loaded model
(:class:`~eliza_backends.backend.model_info.ModelInfo`) and shared by its sessions. Its tokenize
function is llguidance's own greedy tokenization over the same vocabulary: the masks admit every
tokenization of the allowed text, so tokenization is used only for llguidance's forced-text
shortcuts and never calls back into a runtime (nothing native is touched after the weights are
freed).
"""

from __future__ import annotations

import functools
import json
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from ..errors import (
    BackendRuntimeError,
    ConstraintError,
    InvalidArgumentError,
    UnsupportedOperationError,
)

if TYPE_CHECKING:
    import numpy as np


ConstraintKind = Literal["json_schema", "regex", "grammar"]

#: The pip extra that installs the constraint engine.
EXTRA = "eliza-backends[structured]"


@dataclass(frozen=True)
class Constraint:
    """What the generated text must match. Make one with :meth:`json_schema`, :meth:`regex`,
    :meth:`grammar` or :meth:`from_response_format`. ``source`` is the schema as compact JSON
    text (its property order is the order the properties are generated in), the regex, or the
    grammar (Lark; GBNF is converted when the constraint is built)."""

    kind: ConstraintKind
    source: str

    @classmethod
    def json_schema(cls, schema: Mapping[str, Any] | bool | str) -> Constraint:
        """JSON valid against ``schema`` (a dict, JSON text, or True for any JSON object)."""
        if schema is True:
            schema = {"type": "object"}
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as exc:
                raise InvalidArgumentError(f"json_schema is not valid JSON: {exc}") from None
        if not isinstance(schema, Mapping):
            raise InvalidArgumentError("json_schema must be a JSON schema object (a dict), or "
                                       f"True for any JSON object; got {type(schema).__name__}")
        try:
            text = json.dumps(schema, separators=(",", ":"))  # key order is generation order
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"json_schema is not JSON-serialisable: {exc}") from None
        return cls("json_schema", text)

    @classmethod
    def regex(cls, pattern: str) -> Constraint:
        """Text that matches ``pattern`` as a whole (Rust ``regex`` syntax, no lookaround)."""
        if not isinstance(pattern, str) or not pattern:
            raise InvalidArgumentError("regex must be a non-empty string")
        return cls("regex", pattern)

    @classmethod
    def grammar(cls, grammar: str) -> Constraint:
        """Text of a context-free grammar: llguidance's Lark dialect (``start: ...``), or GBNF
        (``root ::= ...``, as llama.cpp takes), told apart by ``::=``."""
        if not isinstance(grammar, str) or not grammar.strip():
            raise InvalidArgumentError("grammar must be a non-empty string (Lark or GBNF)")
        return cls("grammar", grammar)

    @classmethod
    def from_response_format(cls, response_format: Mapping[str, Any]) -> Constraint | None:
        """The constraint of an OpenAI ``response_format``: ``{"type": "text"}`` (None),
        ``{"type": "json_object"}`` (any JSON object) or ``{"type": "json_schema",
        "json_schema": {"name": ..., "schema": {...}}}``."""
        if not isinstance(response_format, Mapping):
            raise InvalidArgumentError("response_format must be an object such as "
                                       "{'type': 'json_object'}")
        kind = response_format.get("type", "text")
        if kind == "text":
            return None
        if kind == "json_object":
            return cls.json_schema(True)
        if kind == "json_schema":
            spec = response_format.get("json_schema")
            if not isinstance(spec, Mapping) or not isinstance(spec.get("schema", {}), Mapping):
                raise InvalidArgumentError(
                    "response_format json_schema needs {'json_schema': {'name': ..., "
                    "'schema': {...}}}")
            return cls.json_schema(spec.get("schema") or True)
        raise InvalidArgumentError(f"response_format type {kind!r} is not one of 'text', "
                                   "'json_object', 'json_schema'")

    @property
    def is_gbnf(self) -> bool:
        """True for a grammar written in GBNF (``::=`` rules)."""
        return self.kind == "grammar" and "::=" in self.source

    def describe(self) -> str:
        """A short description for messages."""
        text = self.source if len(self.source) <= 60 else self.source[:57] + "..."
        return f"{self.kind} {text!r}"


def _llguidance() -> Any:
    try:
        import llguidance
    except ImportError:
        raise UnsupportedOperationError(
            f"constrained decoding needs llguidance: pip install '{EXTRA}'") from None
    return llguidance


def grammar_text(constraint: Constraint) -> str:
    """The llguidance grammar (JSON text) of ``constraint``. JSON is compact (no whitespace
    between tokens), so the same schema always gives the same bytes."""
    llg = _llguidance()
    matcher = llg.LLMatcher
    if constraint.kind == "json_schema":
        try:
            return str(matcher.grammar_from_json_schema(
                constraint.source, defaults={"whitespace_flexible": False}))
        except ValueError as exc:
            raise InvalidArgumentError(f"json_schema is not usable: {exc}") from None
    if constraint.kind == "regex":
        return str(matcher.grammar_from_regex(constraint.source))
    lark = constraint.source
    if constraint.is_gbnf:
        from llguidance.gbnf_to_lark import gbnf_to_lark

        try:
            lark = gbnf_to_lark(lark)
        except Exception as exc:  # the converter raises plain exceptions
            raise InvalidArgumentError(f"grammar (GBNF) does not convert: {exc}") from None
    return str(matcher.grammar_from_lark(lark))


def check_compiles(constraint: Constraint) -> None:
    """Raise :class:`InvalidArgumentError` when ``constraint`` does not compile (a regex or
    grammar syntax error, an unknown rule, a JSON schema llguidance cannot turn into a
    grammar), so a bad request is refused before any session work. Needs no vocabulary;
    cached per constraint (a few ms the first time)."""
    error = _compile_error(constraint.kind, constraint.source)
    if error:
        raise InvalidArgumentError(f"{constraint.kind} does not compile: {error.strip()}")


@functools.lru_cache(maxsize=256)
def _compile_error(kind: ConstraintKind, source: str) -> str:
    grammar = grammar_text(Constraint(kind, source))
    return str(_llguidance().LLMatcher.validate_grammar(grammar))


class TokenVocabulary:
    """A model's vocabulary as the constraint engine sees it (an llguidance ``LLTokenizer``):
    each token's bytes, control tokens marked special, the end-of-generation ids as EOS.
    Immutable once built; thread-safe to share."""

    def __init__(self, pieces: Sequence[bytes], control: Mapping[int, str],
                 eos: Sequence[int]) -> None:
        """``pieces[i]``: the bytes token ``i`` adds to the text (b"" for control tokens);
        ``control``: control-token texts by id (for the ones known); ``eos``: the ids the
        grammar ends with (at least one)."""
        llg = _llguidance()
        tokens = [p if p else b"\xff" + control.get(i, f"<[{i}]>").encode()
                  for i, p in enumerate(pieces)]
        self.size = len(tokens)
        if not eos:
            raise UnsupportedOperationError("constrained decoding needs a model with an "
                                            "end-of-generation token")
        eos_ids = sorted(eos)
        # llguidance asks its tokenizer callback to tokenize forced text; a first tokenizer
        # with no callback gives the greedy tokenization the second one uses (see the module
        # docstring: no runtime is called back)
        plain = llg.LLTokenizer(llg.TokenizerWrapper(_Vocab(tokens, eos_ids[0], None)),
                                eos_token=eos_ids)

        def tokenize(data: bytes | str) -> list[int]:
            text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
            return list(plain.greedy_tokenize(text))

        self.tokenizer = llg.LLTokenizer(
            llg.TokenizerWrapper(_Vocab(tokens, eos_ids[0], tokenize)), eos_token=eos_ids)


class _Vocab:
    """The duck-typed tokenizer llguidance's ``TokenizerWrapper`` reads."""

    def __init__(self, tokens: list[bytes], eos: int,
                 tokenize: Callable[[bytes | str], list[int]] | None) -> None:
        self.tokens = tokens
        self.eos_token_id = eos
        self.bos_token_id = None
        self.special_token_ids = [i for i, t in enumerate(tokens) if t[:1] == b"\xff"]
        self._tokenize = tokenize

    def __call__(self, data: bytes | str) -> list[int]:
        return self._tokenize(data) if self._tokenize is not None else []


class VocabularyFacts(Protocol):
    """What :func:`model_vocabulary` reads about a model (a
    :class:`~eliza_backends.backend.model_info.ModelInfo` has it; this package sits below the
    plugin kit and does not import it). Hashable and weakly referenceable: the vocabulary is
    cached per object."""

    @property
    def vocab_size(self) -> int: ...
    @property
    def eog_token_ids(self) -> frozenset[int]: ...
    @property
    def control_texts(self) -> frozenset[str]: ...


_vocab_lock = threading.Lock()
_vocabularies: weakref.WeakKeyDictionary[VocabularyFacts, TokenVocabulary] = \
    weakref.WeakKeyDictionary()


def model_vocabulary(info: VocabularyFacts, piece: Callable[[int], bytes],
                     control_id: Callable[[str], int | None]) -> TokenVocabulary:
    """The :class:`TokenVocabulary` of the model ``info`` describes, built on first use from
    ``piece(token_id)`` and the control-token texts (``control_id(text)`` is the id of one, or
    None), then shared by every session on that model."""
    with _vocab_lock:
        found = _vocabularies.get(info)
        if found is None:
            pieces = [piece(t) for t in range(info.vocab_size)]
            control = {}
            for text in info.control_texts:
                tid = control_id(text)
                if tid is not None and not pieces[tid]:
                    control[tid] = text
            found = TokenVocabulary(pieces, control, sorted(info.eog_token_ids))
            _vocabularies[info] = found
        return found


class ConstraintMatcher:
    """One generation's parser state for a :class:`Constraint` over a
    :class:`TokenVocabulary`. Owned by one session; used on its consumer thread.

    Per token: :meth:`fill_mask` (the allowed ids as a bool array, cached until the state
    changes), then :meth:`consume` the sampled token. :meth:`valid_prefix` checks drafts."""

    def __init__(self, constraint: Constraint, vocabulary: TokenVocabulary) -> None:
        import numpy as np

        llg = _llguidance()
        self.constraint = constraint
        self._np = np
        self._matcher = llg.LLMatcher(vocabulary.tokenizer, grammar_text(constraint),
                                      log_level=0)
        if self._matcher.is_error():
            raise InvalidArgumentError(
                f"{constraint.kind} does not compile: {self._matcher.get_error()}")
        self._size = vocabulary.size
        self._bits = np.zeros(((vocabulary.size + 31) // 32,), dtype=np.int32)
        self._allowed: np.ndarray | None = None

    def fill_mask(self) -> np.ndarray:
        """The ids allowed next, as a bool array of the vocabulary's size (read-only; valid
        until the next :meth:`consume`). When the text is complete only the end ids are.
        Raises :class:`ConstraintError` when the engine gives up on the constraint (here or
        in :meth:`consume`)."""
        if self._allowed is None:
            np = self._np
            bits = self._bits
            self._matcher.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
            self._check()
            allowed = np.unpackbits(bits.view(np.uint8), bitorder="little")[:self._size]
            self._allowed = allowed.view(np.bool_)
        return self._allowed

    def consume(self, token: int) -> None:
        """Advance past ``token`` (it must be allowed: one the mask let through)."""
        self._allowed = None
        if not self._matcher.consume_token(token):
            self._check()
            raise BackendRuntimeError(f"token {token} broke the {self.constraint.kind} "
                                      "constraint (a sampler ignored the mask: a backend bug)")

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many of ``tokens`` the constraint accepts from the current state."""
        return int(self._matcher.validate_tokens(list(tokens)))

    @property
    def done(self) -> bool:
        """True when nothing but an end token may follow."""
        return bool(self._matcher.is_stopped())

    def _check(self) -> None:
        if not self._matcher.is_error():
            return
        error = str(self._matcher.get_error()).split("\n<state>")[0].strip()
        if any(word in error.lower() for word in _LIMIT_WORDS):
            raise ConstraintError(f"the {self.constraint.kind} constraint is beyond the "
                                  f"constraint engine's limits ({error}); simplify it (fewer "
                                  "alternatives or nesting levels)")
        raise BackendRuntimeError(f"the {self.constraint.kind} constraint failed: {error}")


#: Words of llguidance's errors that say a parser limit was hit (the request's fault).
_LIMIT_WORDS = ("max is", "limit", "too many", "too large", "too long", "exceeded")


__all__ = ["EXTRA", "Constraint", "ConstraintError", "ConstraintKind", "ConstraintMatcher",
           "TokenVocabulary",
           "check_compiles", "grammar_text", "model_vocabulary"]
