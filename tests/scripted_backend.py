"""A small scripted backend: pure Python, deterministic, no model, honest about its contract.

It exists to run the conformance kit and the selector without a runtime. Its "model" is a
fixed function of the last three tokens; prefill costs a little real time per chunk (so cancel
can land mid-prefill) and checks the cancel flag between chunks, like a real backend. The vocab
is the 256 bytes plus BOS (256) and EOS (257).

Factories are configurable so selector tests can build the resolution table from real plugin
distributions (see ``tests/conftest.py``): name, aliases, rank, availability, and which
``text/*.<suffix>`` files it serves.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from eliza_backends import (
    Availability,
    Capabilities,
    Decoded,
    Factory,
    InferenceContext,
    ModelInfo,
    Session,
    StreamConfig,
)

BOS, EOS, VOCAB = 256, 257, 258


def next_token(history: list[int], seed: int) -> int:
    """The scripted model: a deterministic function of the last three tokens."""
    a, b, c = ([*history[-3:], 0, 0, 0])[:3] if len(history) >= 3 else (0, 0, len(history))
    value = (a * 7 + b * 13 + c * 31 + seed) % 97
    if value == 0 and len(history) > 40:
        return EOS
    return 97 + value % 26 if value % 5 else 32  # lowercase letters and spaces


class ScriptedSession(Session):
    """A session over :func:`next_token` with every optional feature."""

    backend_name = "scripted"

    def __init__(self, config: StreamConfig, context: InferenceContext | None,
                 artifact: Path | None = None, chunk_seconds: float = 0.0005) -> None:
        self._kv: list[int] = []
        self._chunk_seconds = chunk_seconds
        self._rng_state = config.seed
        info = ModelInfo(vocab_size=VOCAB, eog_token_ids=frozenset({EOS}), bos_token_id=BOS,
                         artifact=artifact, runtime="scripted-runtime 1")
        super().__init__(config, context, info)

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(slots=True)

    def _prefill(self, token_ids: list[int]) -> None:
        for off in range(0, len(token_ids), self.config.batch_size):
            self._raise_if_cancelled()
            time.sleep(self._chunk_seconds)
            self._kv.extend(token_ids[off:off + self.config.batch_size])

    def _sample(self) -> int:
        tok = next_token(self._kv, 0)
        if not self.config.greedy:  # a tiny seeded LCG perturbation stands in for sampling
            self._rng_state = (self._rng_state * 1103515245 + 12345) % (1 << 31)
            if tok != EOS and self._rng_state % 3 == 0:
                tok = 97 + self._rng_state % 26
        return tok

    def _decode(self, max_tokens: int) -> Decoded:
        out = []
        for _ in range(max_tokens):
            self._raise_if_cancelled()
            tok = self._sample()
            self._kv.append(tok)
            out.append(tok)
            time.sleep(0.0002)
            if tok == EOS and not self.config.ignore_eos:
                break
        return Decoded(out)

    def _reset(self) -> None:
        self._kv = []
        self._rng_state = self.config.seed

    def _truncate(self, n_keep: int) -> bool:
        del self._kv[n_keep:]
        return True

    def _token_bytes(self, token_id: int) -> bytes:
        return bytes([token_id]) if token_id < 256 else b""

    def _tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        return ([BOS] if add_special else []) + list(text.encode("utf-8"))

    def _save_state(self) -> bytes:
        return json.dumps({"kv": self._kv, "rng": self._rng_state}).encode()

    def _restore_state(self, payload: bytes, tokens: list[int]) -> None:
        state = json.loads(payload)
        self._kv = [int(t) for t in state["kv"]][: len(tokens)]
        self._rng_state = int(state["rng"])


class ScriptedFactory(Factory):
    """A configurable factory serving ``text/*.<suffix>`` with :class:`ScriptedSession`."""

    name = "scripted"
    formats = ()

    def __init__(self, name: str = "scripted", *, aliases: tuple[str, ...] = (), rank: int = 1,
                 available: bool = True, reason: str = "not on this host",
                 suffix: str = ".scripted", installed: bool = True) -> None:
        self.name = name  # type: ignore[misc]
        self.aliases = aliases  # type: ignore[misc]
        self._rank = rank
        self._available = available
        self._reason = reason
        self._suffix = suffix
        self._installed = installed

    def available(self) -> Availability:
        if self._available:
            return Availability.yes()
        return Availability.no(self._reason) if self._installed else \
            Availability.missing(self._reason)

    def can_serve(self, bundle_dir: str | Path) -> bool:  # type: ignore[override]
        text = Path(bundle_dir) / "text"
        return text.is_dir() and any(p.suffix == self._suffix for p in text.iterdir())

    def preference_rank(self) -> int:
        return self._rank

    def rank_reason(self) -> str:
        return f"scripted rank {self._rank}"

    def open(self, context: InferenceContext, config: StreamConfig) -> Session:
        found = sorted((context.bundle_dir / "text").glob(f"*{self._suffix}"))
        return ScriptedSession(config, context, found[0] if found else None)
