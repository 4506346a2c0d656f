"""The echo "runtime": a model file, and a Session that fills in the contract's hooks.

The base class has already checked every argument when a hook runs (token ids against
``vocab_size``, room in the context window, call order, a closed or busy session) and holds
the consumer lock; the hooks only translate to the runtime. What the model *is* (vocabulary,
end token, BOS, chat template, the file slots are fingerprinted by) is data, a
:class:`~eliza_backends.ModelInfo` made once at load and handed to ``Session.__init__``.

The session uses only hooks (the ``_`` methods it defines) and helpers of the base class
(``_raise_if_cancelled``); the base class's internals are out of its reach.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from eliza_backends import (
    BundleError,
    Capabilities,
    Decoded,
    InferenceContext,
    ModelInfo,
    Session,
    SlotError,
    StreamConfig,
)

BOS, EOS = 256, 257  # token ids 0..255 are the bytes
VOCAB = 258
RUNTIME = "eliza-echo 0.1.0"  # written into slot files: state is not portable across versions
TEMPLATE = ("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}[assistant] {% endif %}")


@dataclass(frozen=True)
class EchoModel:
    """The loaded "weights": the period, and the facts sessions on it share."""

    path: Path
    period: int
    info: ModelInfo

    def next_token(self, history: list[int]) -> int:
        """The forward pass: the token ``period`` positions back, EOS if there is none."""
        back = len(history) - self.period
        if back < 0 or history[back] >= 256:
            return EOS
        return history[back]


def load_model(path: Path) -> EchoModel:
    """Read and check a ``.echo`` file; a bad file is a BundleError, never a crash later."""
    try:
        period = json.loads(path.read_text(encoding="utf-8"))["period"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BundleError(f"{path} is not an echo model ({type(exc).__name__}: {exc}); it "
                          'must hold JSON like {"period": 12}') from None
    if not isinstance(period, int) or isinstance(period, bool) or not 1 <= period <= 4096:
        raise BundleError(f"{path}: period must be an int in 1..4096, got {period!r}")
    info = ModelInfo(vocab_size=VOCAB, eog_token_ids=frozenset({EOS}), bos_token_id=BOS,
                     chat_template=TEMPLATE, artifact=path, runtime=RUNTIME)
    return EchoModel(path, period, info)


class EchoSession(Session):
    """One generation over an :class:`EchoModel`. The KV cache is the list of tokens seen."""

    backend_name = "echo"

    def __init__(self, config: StreamConfig, context: InferenceContext | None,
                 model: EchoModel, *, delay: float = 0.0) -> None:
        self._model = model
        self._delay = delay
        self._kv: list[int] = []
        # last: it registers the session with the context. A real runtime passes the
        # context_size it actually allocated (the default is config.context_size).
        super().__init__(config, context, model.info)

    @property
    def capabilities(self) -> Capabilities:
        # honest: no sampler (greedy only), no speculative drafter; everything else works
        return Capabilities(token_input=True, prefix_reuse=True, slots=True,
                            cancel_prefill=True, sampling=False)

    # ------------------------------------------------------------ the hooks

    def _prefill(self, token_ids: list[int]) -> None:
        step = self.config.batch_size  # feed the runtime in chunks of at most batch_size
        for start in range(0, len(token_ids), step):
            self._raise_if_cancelled()  # cancel() lands between chunks
            time.sleep(self._delay)
            self._kv.extend(token_ids[start:start + step])

    def _decode(self, max_tokens: int) -> Decoded:
        out: list[int] = []
        for _ in range(max_tokens):
            self._raise_if_cancelled()  # ... and between tokens
            time.sleep(self._delay)
            token = self._model.next_token(self._kv)
            self._kv.append(token)
            out.append(token)
            if token == EOS and not self.config.ignore_eos:
                break  # stop right after an end-of-generation token
        return Decoded(out)

    def _reset(self) -> None:
        self._kv.clear()

    def _truncate(self, n_keep: int) -> bool:
        del self._kv[n_keep:]
        return True  # prefix reuse works: reset_keep(n) keeps n tokens

    def _token_bytes(self, token_id: int) -> bytes:
        return bytes([token_id]) if token_id < 256 else b""  # specials add no text

    def _tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        # no text spells BOS or EOS here, so parse_special changes nothing
        return ([BOS] if add_special else []) + list(text.encode("utf-8"))

    def _save_state(self) -> bytes:
        return json.dumps(self._kv).encode("utf-8")

    def _restore_state(self, payload: bytes, tokens: list[int]) -> None:
        try:
            kv = [int(t) for t in json.loads(payload)]
        except (ValueError, TypeError) as exc:
            raise SlotError(f"echo slot payload is corrupted: {exc}") from None
        if kv != tokens:
            raise SlotError("echo slot payload does not match its token history")
        self._kv = kv

    def _close(self) -> None:
        self._kv = []  # the shared model belongs to the InferenceContext, not the session
