"""The Core ML session (macOS 15+): a stateful Core ML language model through coremltools.

NOT RUN on the development host (Linux): Core ML prediction needs macOS. Two model layouts are
served, told apart by the model description:

* **stateful** (Apple's stateful-LLM conversions, "On Device Llama 3.1 with Core ML"): inputs
  ``inputIds`` (int32, ``(1, n)``) and ``causalMask`` (float16, ``(1, 1, n, past + n)``), KV
  state tensors (``keyCache`` / ``valueCache``) made by ``model.make_state()``, output
  ``logits`` (``(1, n, vocab)``). The model writes the new keys/values at the positions implied
  by the mask width, so truncating the sequence only moves the write position (stale entries
  are masked out and overwritten). ``.mlmodelc`` (no readable spec) is assumed to be this.
* **stateless** (the tiny bundle's ``tiny.mlpackage``): one int32 ids input ``(1, T)`` ->
  ``logits`` ``(1, T, vocab)``, no state: every step recomputes the whole sequence (correct,
  O(n^2); the context is capped at the input's upper bound).

The tokenizer is a Hugging Face ``tokenizer.json`` (or a SentencePiece ``tokenizer.model``)
found by the core's :func:`~eliza_backends.backend.find_tokenizer` (inside the model,
``text/<stem>.tokenizer.json``, ``text/tokenizer.json``, or the bundle's MLX folder), with
its end tokens, BOS and chat template from :func:`~eliza_backends.prompt.tokenizer.tokenizer_facts`:
the same as the MLX session and LiteRT read for the same bundle. Sampling uses the core's numpy
:class:`~eliza_backends.runtime.sampling.Sampler` (Core ML-only hosts need not have mlx). Slots are
not supported (``capabilities.slots`` is False).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import coremltools as ct  # type: ignore[import-not-found,unused-ignore]
import numpy as np

from eliza_backends import (
    BackendRuntimeError,
    BundleError,
    Capabilities,
    Decoded,
    InferenceContext,
    ModelInfo,
    Session,
    StreamConfig,
    UnsupportedOperationError,
)
from eliza_backends.backend import (
    Sampler,
    Tokenizer,
    find_tokenizer,
    load_tokenizer,
    tokenizer_facts,
)

from .options import MLXOptions
from .session_hooks import TokenizerHooks

_UNITS = {"all": "ALL", "cpu_only": "CPU_ONLY", "cpu_and_gpu": "CPU_AND_GPU",
          "cpu_and_ne": "CPU_AND_NE"}


def _load_tokenizer(path: Path) -> tuple[Tokenizer, ModelInfo]:
    """The bundle's tokenizer for the model at ``path`` and the model's facts."""
    found = find_tokenizer(path)
    if found is None:
        raise BundleError(f"no tokenizer for {path.name}: put a tokenizer.json (or a "
                          f"SentencePiece tokenizer.model) at text/{path.stem}.tokenizer.json "
                          "or text/tokenizer.json")
    tok = load_tokenizer(found)
    facts = tokenizer_facts(tok, found.parent, tok.vocab_size)
    return tok, ModelInfo(vocab_size=tok.vocab_size, eog_token_ids=facts.eog,
                          bos_token_id=facts.bos if facts.add_bos else None,
                          chat_template=facts.chat_template,
                          template_tokens=facts.template_tokens,
                          control_tokens=tok.control_texts)


@dataclass(frozen=True)
class Layout:
    """How to call one Core ML language model (see the module docstring)."""

    stateful: bool
    ids_input: str = "inputIds"
    mask_input: str | None = "causalMask"
    logits_output: str = "logits"
    max_length: int | None = None


def read_layout(path: Path) -> Layout:
    """The model's layout from its spec (``.mlmodelc``: the stateful default)."""
    if path.suffix == ".mlmodelc":
        return Layout(stateful=True)
    try:
        spec = ct.utils.load_spec(str(path))
    except Exception as exc:
        raise BundleError(f"Core ML could not read the model description of {path}: {exc}") \
            from None
    desc = spec.description
    inputs = {i.name: i for i in desc.input}
    outputs = [o.name for o in desc.output]
    logits = "logits" if "logits" in outputs else (outputs[0] if outputs else "logits")
    if len(desc.state) > 0:  # the KV state's length (its next-to-last axis) caps the context
        shape = list(desc.state[0].type.stateType.arrayType.shape)
        return Layout(stateful=True, logits_output=logits,
                      max_length=int(shape[-2]) if len(shape) >= 2 else None)
    ids = next((n for n in ("input_ids", "inputIds", "tokens") if n in inputs),
               next(iter(inputs), "input_ids"))
    upper: int | None = None
    try:
        ranges = inputs[ids].type.multiArrayType.shapeRange.sizeRanges
        if len(ranges) == 2 and ranges[1].upperBound > 0:
            upper = int(ranges[1].upperBound)
    except (KeyError, AttributeError, IndexError):
        upper = None
    return Layout(stateful=False, ids_input=ids, mask_input=None, logits_output=logits,
                  max_length=upper)


def open_session(context: InferenceContext, config: StreamConfig, options: MLXOptions,
                 path: Path) -> CoreMLSession:
    """Load (or reuse) the Core ML model on ``context`` and open a session on it."""
    if config.drafter != "none":
        raise UnsupportedOperationError("Core ML sessions do not support speculative drafters")
    units = getattr(ct.ComputeUnit, _UNITS[options.compute_units])

    def load() -> tuple[Any, Tokenizer, ModelInfo, Layout]:
        tokenizer, info = _load_tokenizer(path)
        layout = read_layout(path)
        try:
            if path.suffix == ".mlmodelc":
                model = ct.models.CompiledMLModel(str(path), compute_units=units)
            else:
                model = ct.models.MLModel(str(path), compute_units=units)
        except Exception as exc:
            raise BundleError(f"Core ML could not load {path}: {exc}") from None
        return model, tokenizer, info, layout

    model, tokenizer, info, layout = context.shared(
        ("coreml", str(path), options.compute_units), load)
    return CoreMLSession(model, tokenizer, info, layout, config, context)


class CoreMLSession(TokenizerHooks, Session):
    """One Core ML generation (stateful: ``make_state()`` per session)."""

    backend_name = "mlx-coreml"

    def __init__(self, model: Any, tokenizer: Tokenizer, info: ModelInfo, layout: Layout,
                 config: StreamConfig, context: InferenceContext | None) -> None:
        self._model = model
        self._tokenizer = tokenizer
        self._layout = layout
        self._state = model.make_state() if layout.stateful else None
        self._n_kv = 0
        self._seq: list[int] = []  # the tokens fed so far (len == _n_kv)
        self._logits: np.ndarray[Any, Any] | None = None
        self._sampler = Sampler(config)
        cap = layout.max_length
        super().__init__(config, context, info,
                         context_size=min(config.context_size, cap) if cap else None)

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(token_input=True, prefix_reuse=True, slots=False,
                            cancel_prefill=False, sampling=True)

    def _forward(self, ids: list[int]) -> np.ndarray[Any, Any]:
        """Feed ``ids`` after the first ``_n_kv`` tokens; logits of the last one."""
        lay, n, past = self._layout, len(ids), self._n_kv
        try:
            if lay.stateful:
                mask = np.full((1, 1, n, past + n), -np.inf, dtype=np.float16)
                for i in range(n):
                    mask[0, 0, i, :past + i + 1] = 0
                out = self._model.predict(
                    {lay.ids_input: np.array([ids], dtype=np.int32), lay.mask_input: mask},
                    state=self._state)
            else:  # no state: recompute the whole sequence
                seq = [*self._seq, *ids]
                out = self._model.predict({lay.ids_input: np.array([seq], dtype=np.int32)})
        except Exception as exc:
            raise BackendRuntimeError(f"Core ML prediction failed: {exc}") from None
        self._n_kv = past + n
        self._seq.extend(ids)
        logits: np.ndarray[Any, Any] = np.asarray(out[lay.logits_output],
                                                   dtype=np.float32)[0, -1]
        return logits

    def _prefill(self, token_ids: list[int]) -> None:
        start, step = self._n_kv, self.config.batch_size
        try:
            for off in range(0, len(token_ids), step):
                self._raise_if_cancelled()
                self._logits = self._forward(token_ids[off:off + step])
        except BaseException:
            self._n_kv, self._logits = start, None
            del self._seq[start:]
            raise

    def _sample(self, logits: np.ndarray[Any, Any], out: list[int]) -> int:
        return self._sampler.sample(logits, [*self._sequence, *out])

    def _decode(self, max_tokens: int) -> Decoded:
        out: list[int] = []
        stops = self._stop_tokens
        for i in range(max_tokens):
            if i:
                self._raise_if_cancelled()
                self._logits = self._forward(out[-1:])
            assert self._logits is not None
            tok = self._sample(self._logits, out)
            out.append(tok)
            if tok in stops:
                break
        # feed the last token now so the state always holds the whole history
        self._logits = self._forward(out[-1:])
        return Decoded(out)

    def _reset(self) -> None:
        self._state = self._model.make_state()
        self._n_kv, self._logits = 0, None
        self._seq = []
        self._sampler.reset()

    def _truncate(self, n_keep: int) -> bool:
        self._n_kv = min(self._n_kv, n_keep)
        del self._seq[self._n_kv:]
        self._logits = None
        self._sampler.reset()
        return True

    def _close(self) -> None:
        self._state = None


def describe(path: Path) -> dict[str, Any]:
    """Input/output names of a Core ML model (for bug reports)."""
    spec = ct.utils.load_spec(str(path))
    return {"inputs": [str(i.name) for i in spec.description.input],
            "outputs": [str(o.name) for o in spec.description.output],
            "states": [str(s.name) for s in spec.description.state]}


__all__ = ["CoreMLSession", "describe", "open_session"]
