"""What the MLX plugin's three sessions implement alike: mlx-lm's :mod:`~eliza_mlx.session`,
the batched :mod:`~eliza_mlx.batched_session` and Core ML's :mod:`~eliza_mlx.coreml_session`.

:class:`TokenizerHooks` gives the token hooks of a session whose tokenizer is the core's
:class:`~eliza_backends.backend.Tokenizer`; :func:`cut_lazy_cache` is the rule for cutting a
cache that is lazy by one token (the last sampled token is fed with the next call) back to a
prefix of the history.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from eliza_backends.backend import Tokenizer


class TokenizerHooks:
    """``_token_bytes`` and ``_tokenize`` through the core's :class:`Tokenizer` (an MLX
    folder's ``tokenizer.json``, or the one found beside a Core ML model). Mixed in before
    :class:`~eliza_backends.Session`; the session sets :attr:`_tokenizer` before calling
    ``Session.__init__``. Thread-safe as the tokenizer is (read-only after loading)."""

    _tokenizer: Tokenizer

    def _token_bytes(self, token_id: int) -> bytes:
        return self._tokenizer.piece(token_id)

    def _tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        return self._tokenizer.encode(text, add_special=add_special, parse_special=parse_special)


def cut_lazy_cache(n_kv: int, n_keep: int, sequence: Sequence[int],
                   trim: Callable[[int], bool]) -> tuple[bool, int | None]:
    """Cut a cache of ``n_kv`` positions back to the first ``n_keep`` tokens of the history
    ``sequence`` (the cache holds the history, or all of it but the last token: pending).

    ``trim(k)`` drops the cache's last ``k`` positions (False: the runtime cannot). Returns
    ``(done, pending)``: ``done`` is False when the cache cannot be cut to ``n_keep`` (``trim``
    refused, or the cache lacks more than one of the kept tokens; ``_truncate`` then returns
    False); ``pending`` is the kept token the cache lacks, to be fed with the next prefill (None:
    the cache holds all ``n_keep``)."""
    drop = n_kv - n_keep
    if drop > 0:
        return trim(drop), None
    if drop == 0:
        return True, None
    if drop == -1:
        return True, sequence[n_keep - 1]
    return False, None


__all__ = ["TokenizerHooks", "cut_lazy_cache"]
