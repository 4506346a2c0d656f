"""Facts about a loaded model, as data: :class:`ModelInfo`.

A backend reads these once, when it loads the weights, and hands them to
:class:`~eliza_backends.backend.session.Session` (``Session.__init__(config, context, info)``); the
session's public properties (``vocab_size``, ``eog_token_ids``, ``bos_token_id``,
``chat_template``, ``template_tokens``) answer from it, and slot files are stamped with its
``fingerprint`` and ``runtime``. Sessions on one loaded model share one ``ModelInfo``.

Two facts are computed on first use and then cached, because they cost I/O or a vocabulary
scan that most streams never need: :attr:`ModelInfo.fingerprint` (reads the artifact) and
:attr:`ModelInfo.control_texts` (the tokenizer's control-token strings, needed only when a chat
message contains one).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from ..errors import UnsupportedOperationError
from ..hashing import fingerprint_artifact


@dataclass(frozen=True, eq=False)
class ModelInfo:
    """What a session needs to know about its model. Immutable; shared by sessions.

    ``vocab_size``: valid token ids are ``0..vocab_size-1``. ``eog_token_ids``: ids that end
    generation (EOS, end of turn). ``bos_token_id``: the id ``tokenize(..., add_special=True)``
    prepends, None when the model prepends nothing. ``chat_template``: the artifact's own Jinja
    chat template. ``template_tokens``: special-token texts a template may use (``bos_token``,
    ``eos_token``). ``artifact``: the file or folder :attr:`fingerprint` identifies (None: the
    session cannot write slots). ``runtime``: the runtime and its version, written into slots
    (a slot restores only on the same one). ``control_tokens``: the texts the tokenizer turns
    into control tokens when ``parse_special`` is on, or a function returning them (called
    once, on first use; see :attr:`control_texts`).
    """

    vocab_size: int
    eog_token_ids: frozenset[int] = frozenset()
    bos_token_id: int | None = None
    chat_template: str | None = None
    template_tokens: Mapping[str, str] = field(default_factory=dict)
    artifact: Path | None = None
    runtime: str = ""
    control_tokens: Collection[str] | Callable[[], Collection[str]] = field(
        default=frozenset(), repr=False)

    @cached_property
    def fingerprint(self) -> str:
        """Identity of :attr:`artifact` for slot files (computed once, on first use)."""
        if self.artifact is None:
            raise UnsupportedOperationError("this model has no artifact to fingerprint, so its "
                                            "sessions cannot save or restore slots")
        return fingerprint_artifact(self.artifact)

    @cached_property
    def control_texts(self) -> frozenset[str]:
        """The control-token strings (``"<|end|>"`` ...), resolved from
        :attr:`control_tokens` on first use."""
        source = self.control_tokens
        return frozenset(source() if callable(source) else source)


__all__ = ["ModelInfo"]
