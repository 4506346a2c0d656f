"""The LiteRT-LM engine session: ``litert_lm.Engine`` behind the seam, text-level.

LiteRT-LM's Python API takes text and streams text, so this session translates:

* ``prefill(ids)``: the ids are turned into text with the model's tokenizer and must come back
  as exactly the same ids from the engine's own tokenizer, or the call is refused with an
  :class:`InvalidArgumentError` (the engine would otherwise see a different sequence). The
  engine opens every sequence with its start token itself: a leading start token in the ids is
  dropped before the text is made, and when it is missing the engine adds it anyway (one
  context position is reserved for it); the start token anywhere else is passed as text like
  any other token (ChatML's ``<|im_start|>`` opens every turn) and must round-trip too.
* ``next()``: each streamed chunk (one per generated token on the engine's CPU path) is
  re-tokenized with the engine's tokenizer to give ids. When the engine stops by itself before
  the budget (it hit a stop token, which it does not emit) the stream ends with
  ``finish_reason="eos"`` and no token: the session never invents the stop id it did not see.

Limits, declared in :attr:`capabilities`: no token-level input, no slots, no prefix reuse
(``reset_keep`` is a full reset), cancel only between streamed chunks, sampling by the engine
(temperature, top-k, top-p, seed; no min-p, no repeat penalty), no ``ignore_eos`` (refused),
no drafter (``drafters={"none"}``): LiteRT-LM's Python API has an on/off
``enable_speculative_decoding`` switch but reports no drafted/accepted counts (its
``BenchmarkInfo`` has token counts and tokens/s only), so steps carry ``drafted = accepted = 0``
and the engine keeps the model's default speculative setting.

The engine (weights, compiled caches) is shared through the inference context with a cache
directory the context owns (a temporary directory unless the ``cache_dir`` option names one).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import litert_lm  # type: ignore[import-untyped]

from eliza_backends import (
    BackendRuntimeError,
    BundleError,
    Capabilities,
    Decoded,
    InferenceContext,
    InvalidArgumentError,
    ModelInfo,
    Session,
    StreamConfig,
    UnsupportedOperationError,
)
from eliza_backends.backend import MediaItem, MediaTokens, Tokenizer

from .container import container_tokenizer, read_container
from .ladder import Rung
from .litert_lm_media import (
    MARKERS,
    PLANNED_COUNT_MODEL_TYPES,
    container_media,
    media_bytes,
    media_part,
    planned_soft_tokens,
    soft_token_count,
    stream_conversation,
)
from .options import LiteRTOptions


@dataclass
class LoadedEngine:
    """One ``litert_lm.Engine`` and the container facts, shared by sessions."""

    path: Path
    engine: Any
    tokenizer: Tokenizer
    info: ModelInfo
    eog: tuple[int, ...]  # the container's stop ids, in its order (the first is reported)
    max_tokens: int
    cache_dir: str
    owns_cache_dir: bool
    added: dict[int, str]  # added/special token id -> its text (the engine parses it back)
    #: the media kinds the container carries encoders for (the engine runs them on the CPU)
    media: frozenset[str] = frozenset()
    #: soft-token counts computed, not probed (a model type in
    #: ``PLANNED_COUNT_MODEL_TYPES``: :func:`~eliza_litert.litert_lm_media.planned_soft_tokens`),
    #: with these patchify settings
    planned_counts: bool = False
    patchify: tuple[int, int, int] | None = None


def _backend(rung: Rung, threads: int | None) -> Any:
    if rung.engine_backend == "npu":
        return litert_lm.Backend.NPU()
    if rung.engine_backend == "gpu":
        return litert_lm.Backend.GPU()
    return litert_lm.Backend.CPU(thread_count=threads) if threads else litert_lm.Backend.CPU()


#: LiteRT-LM logs dozens of INFO/WARNING lines per engine to stderr; errors only, unless the
#: app sets ELIZA_LITERT_LOG (a litert_lm.LogSeverity name, e.g. INFO).
LOG_ENV = "ELIZA_LITERT_LOG"


def _quiet_native_logs() -> None:
    level = os.environ.get(LOG_ENV, "ERROR").upper()
    severity = getattr(litert_lm.LogSeverity, level, litert_lm.LogSeverity.ERROR)
    with contextlib.suppress(AttributeError):
        litert_lm.set_min_log_severity(severity)


def load_engine(path: Path, rung: Rung, threads: int | None, cache_dir: str | None) -> LoadedEngine:
    """Check the container, then start the engine on the rung's LiteRT-LM backend."""
    _quiet_native_logs()
    container = read_container(path)
    container.check_tflite_section()  # the engine reads the model itself: check it first
    tok = container_tokenizer(container)
    if tok is None:
        raise BundleError(f"{path} has no HF or SentencePiece tokenizer section; the engine "
                          "session needs one to map ids to text (use session='interpreter' with "
                          "a tokenizer file beside it)")
    spec = container.hf_tokenizer_json()
    if spec is not None:
        added = {int(t["id"]): str(t["content"]) for t in json.loads(spec).get("added_tokens", [])
                 if "id" in t and "content" in t}
    else:  # SentencePiece: control pieces stand for themselves in the prompt text
        added = {i: tok.token_text(i) or "" for i in tok.special_ids}
    meta = container.llm_metadata()
    bos = meta.start_token_ids[0] if meta.start_token_ids else (
        tok.token_id(meta.start_token_str) if meta.start_token_str else None)
    eog = tuple(dict.fromkeys(ids[0] for ids in meta.stop_token_ids if len(ids) == 1))
    owns = cache_dir is None
    if cache_dir is None:
        cache_dir = tempfile.mkdtemp(prefix="eliza-litert-")
    elif not Path(cache_dir).is_dir():
        raise InvalidArgumentError(f"cache_dir {cache_dir!r} does not exist; LiteRT-LM needs an "
                                   "existing directory (or leave it unset for a temporary one)")
    media = frozenset(container_media(container))
    encoders = {f"{'vision' if k == 'image' else k}_backend": litert_lm.Backend.CPU()
                for k in media}
    try:
        engine = litert_lm.Engine(str(path), backend=_backend(rung, threads), cache_dir=cache_dir,
                                  max_num_tokens=meta.max_num_tokens, **encoders)
    except Exception as exc:
        if owns:
            shutil.rmtree(cache_dir, ignore_errors=True)
        raise BackendRuntimeError(f"LiteRT-LM could not start an engine on {path} "
                                  f"({rung.engine_backend}): {exc}") from None
    info = ModelInfo(vocab_size=tok.vocab_size, eog_token_ids=frozenset(eog), bos_token_id=bos,
                     chat_template=meta.jinja_prompt_template,
                     template_tokens=tok.template_tokens(bos, frozenset(eog)), artifact=path,
                     control_tokens=tok.control_texts)
    return LoadedEngine(path, engine, tok, info, eog, meta.max_num_tokens or 4096, cache_dir,
                        owns, added, media, meta.model_type in PLANNED_COUNT_MODEL_TYPES,
                        meta.vision_patchify)


def close_engine(loaded: LoadedEngine) -> None:
    """Free the engine (its log lines routed into logging) and remove the temporary cache
    dir it owns."""
    from eliza_backends.backend import native_stderr_to_logging

    with native_stderr_to_logging(logging.getLogger("eliza_litert.native")):
        loaded.engine.close()
    if loaded.owns_cache_dir:
        shutil.rmtree(loaded.cache_dir, ignore_errors=True)


def open_engine_session(context: InferenceContext, config: StreamConfig, options: LiteRTOptions,
                        path: Path, rung: Rung) -> EngineSession:
    """Start (or reuse) the engine on ``context`` and open a session on it."""
    if config.min_p > 0.0 or config.repeat_penalty != 1.0:
        raise UnsupportedOperationError(
            "the LiteRT-LM engine session samples with temperature/top-k/top-p/seed only; "
            "min_p and repeat_penalty need session='interpreter'")
    if config.ignore_eos:
        raise UnsupportedOperationError(
            "the LiteRT-LM engine session cannot ignore end tokens (the engine ends its turn at "
            "a stop token itself); use session='interpreter' for ignore_eos")
    key = ("litert-lm", "engine", str(path), rung.name, config.threads, options.cache_dir)
    loaded = context.shared(key, lambda: load_engine(path, rung, config.threads,
                                                     options.cache_dir), close_engine)
    return EngineSession(loaded, config, context, rung)


class EngineSession(Session):
    """A text-level generation on ``litert_lm.Engine``."""

    backend_name = "litert-lm"

    def __init__(self, loaded: LoadedEngine, config: StreamConfig,
                 context: InferenceContext | None, rung: Rung) -> None:
        self._loaded = loaded
        self.accelerator = rung.engine_backend
        self.ladder_rung = rung.name
        self._session: Any = None
        self._stream: Iterator[Any] | None = None
        self._buffer: list[int] = []
        self._turn_tokens = 0
        #: the engine session's own output budget per turn (max_output_tokens): the config's,
        #: raised to the context window the first time a turn's budget (set_turn) exceeds it
        self._engine_budget = config.max_tokens
        #: media mode (the sequence holds media): the file bytes of each item by digest, and
        #: the conversation streaming the current turn (see litert_lm_media)
        self._media_blobs: dict[str, bytes] = {}
        self._conversation: Any = None
        self._session = self._new_session(config)
        # one position is kept for the start token the engine adds when a sequence does not
        # begin with it
        super().__init__(config, context, loaded.info,
                         context_size=min(config.context_size, loaded.max_tokens) - 1)

    def _sampler(self, config: StreamConfig) -> Any:
        if config.greedy:
            sampler = litert_lm.SamplerConfig(top_k=1, temperature=0.0, seed=config.seed)
        else:
            # top_k 0 means "no top-k" here; LiteRT-LM reads an unset top_k as greedy, so
            # "all of the vocabulary" says it
            top_k = config.top_k or self._loaded.info.vocab_size
            sampler = litert_lm.SamplerConfig(
                top_k=top_k, top_p=config.top_p, temperature=config.temperature,
                seed=config.seed)
        return sampler

    def _new_session(self, config: StreamConfig) -> Any:
        sampler = self._sampler(config)
        try:
            return self._loaded.engine.create_session(
                apply_prompt_template=False, sampler_config=sampler,
                max_output_tokens=self._engine_budget)
        except Exception as exc:
            raise BackendRuntimeError(f"LiteRT-LM could not create a session: {exc}") from None

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(token_input=False, prefix_reuse=False, slots=False,
                            cancel_prefill=False, sampling=True, ignore_eos=False,
                            media=self._loaded.media)

    # ------------------------------------------------------------------ hooks

    def _text_of(self, ids: list[int], *, check: bool = True) -> str:
        """The text the engine is given for ``ids``; ``check``: refuse ids that are not the
        tokenizer's own tokenization of it (off for a replay of the engine's own output,
        which it streamed as text chunk by chunk)."""
        tok, added = self._loaded.tokenizer, self._loaded.added
        raw = b"".join(added[t].encode() if t in added else tok.piece(t) for t in ids)
        if not check:
            return raw.decode("utf-8", "replace")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidArgumentError(
                "the LiteRT-LM engine session takes text: these token ids do not decode to "
                "valid UTF-8, so the engine cannot be given them (use session='interpreter' "
                "for token-level input)") from None
        back = self._loaded.engine.tokenize(text) if text else []
        if list(back) != ids:
            raise InvalidArgumentError(
                f"the LiteRT-LM engine session takes text: token ids {ids[:8]}... do not "
                f"round-trip through the tokenizer (the engine would see {list(back)[:8]}...); "
                "pass the model's own tokenization, or use session='interpreter'")
        return text

    def _prefill(self, token_ids: list[int]) -> None:
        if self.media:
            # media mode: the next decode gives the whole sequence to a conversation
            self._stop_stream()
            self._turn_tokens = 0
            return
        grow = self._turn_max_tokens > self._engine_budget
        if grow:  # (once per session: the new engine session's budget is the whole window)
            self._engine_budget = max(self.context_size, self._turn_max_tokens)
        if grow or self._stream is not None or self._buffer:
            # a turn cut short: the engine decoded past what the caller saw, and a cancelled
            # engine session streams nothing more (its next decode waits forever); or a turn's
            # budget (set_turn) past the engine session's own: the sequence so far is replayed
            # on a fresh session
            self._stop_stream()
            self._reset()
            replay = list(self._sequence)
            if replay and replay[0] == self.bos_token_id:
                replay = replay[1:]  # the engine opens the sequence with it itself
            if replay:
                self._run_prefill(replay, check=False)
        ids = token_ids
        bos = self.bos_token_id
        if not self._sequence and bos is not None and ids and ids[0] == bos:
            ids = ids[1:]  # the engine opens every sequence with its start token itself
        # anywhere else the start token is ordinary prompt text (ChatML's <|im_start|> opens
        # every turn): it goes to the engine as text and must round-trip like any other id
        self._run_prefill(ids)

    def _run_prefill(self, ids: list[int], *, check: bool = True) -> None:
        """Give the engine ``ids`` (after the sequence it holds) as text."""
        text = self._text_of(ids, check=check)
        self._raise_if_cancelled()
        self._turn_tokens = 0
        if not text:  # (the start token alone: the engine adds it itself)
            return
        try:
            self._session.run_prefill([text])
        except Exception as exc:
            raise BackendRuntimeError(f"LiteRT-LM prefill failed: {exc}") from None

    def _decode(self, max_tokens: int) -> Decoded:
        out: list[int] = []
        while len(out) < max_tokens:
            if self._buffer:
                take = self._buffer[:max_tokens - len(out)]
                del self._buffer[:len(take)]
                out += take
                continue
            if self._cancel_requested():
                self._stop_stream(cancel=True)
                self._raise_if_cancelled()
            if self._stream is None:
                if self._turn_tokens >= self._engine_budget:
                    break
                try:
                    self._stream = self._start_stream()
                except Exception as exc:
                    raise BackendRuntimeError(f"LiteRT-LM decode failed: {exc}") from None
            try:
                chunk = next(self._stream)
            except StopIteration:
                # the engine ended its turn (at a stop token it does not emit): say so, never
                # invent the token
                self._stream = None
                self._close_conversation()
                self._turn_tokens = self._engine_budget
                return Decoded(out, finish="eos")
            except Exception as exc:
                self._stream = None
                raise BackendRuntimeError(f"LiteRT-LM decode failed: {exc}") from None
            text = chunk if isinstance(chunk, str) else "".join(chunk.texts)
            if text:
                ids = list(self._loaded.engine.tokenize(text))
                self._turn_tokens += 1
                self._buffer += ids
        if not out:  # the engine's turn is over: end the stream rather than spin
            return Decoded(out, finish="eos")
        return Decoded(out)

    def _start_stream(self) -> Iterator[Any]:
        """The engine's reply stream: the session's decode, or in media mode a conversation
        on the whole sequence (its text runs and its media items in order)."""
        if not self.media:
            return iter(self._session.run_decode_async())
        seq, parts, pos = list(self._sequence), [], 0
        if seq and seq[0] == self.bos_token_id:
            pos = 1  # the engine opens the conversation with it itself
        for span in self.media:  # the span covers the item's markers (the engine adds them)
            parts.append({"type": "text", "text": self._text_of(seq[pos:span.start],
                                                                  check=False)})
            parts.append(media_part(span.kind, self._media_blobs[span.digest]))
            pos = span.end
        parts.append({"type": "text", "text": self._text_of(seq[pos:], check=False)})
        self._conversation, stream = stream_conversation(
            self._loaded.engine, self._sampler(self.config), self._engine_budget,
            [p for p in parts if p.get("text") != ""])
        return stream

    def _media_tokens(self, item: MediaItem) -> MediaTokens:
        if item.kind not in self._loaded.media:
            raise UnsupportedOperationError(
                f"{self._loaded.path.name} carries no {item.kind} encoder")
        data = self._media_blobs.get(item.digest) or media_bytes(item)
        count = planned_soft_tokens(item, self._loaded.patchify) \
            if self._loaded.planned_counts else None
        if count is None:  # (not a size the engine's rule covers: it says, by a probe)
            count = soft_token_count(self._loaded.engine, self._sampler(self.config),
                                     item.kind, data)
        begin, soft, end = (self._loaded.tokenizer.token_id(t) for t in MARKERS[item.kind])
        if begin is None or soft is None or end is None:
            raise BundleError(f"{self._loaded.path.name}'s tokenizer lacks the {item.kind} "
                              f"markers {MARKERS[item.kind]}")
        return MediaTokens((begin,), soft, count, (end,), handle=data)

    def _prefill_media(self, item: MediaItem, tokens: MediaTokens) -> None:
        assert isinstance(tokens.handle, bytes)
        self._stop_stream()
        self._media_blobs[item.digest] = tokens.handle
        self._turn_tokens = 0

    def _stop_stream(self, cancel: bool = True) -> None:
        self._buffer = []
        if self._stream is None:
            return
        runner = self._conversation if self._conversation is not None else self._session
        if cancel:
            with contextlib.suppress(Exception):
                runner.cancel_process()
        try:
            for _ in self._stream:
                pass
        except Exception:
            pass
        self._stream = None
        self._close_conversation()

    def _close_conversation(self) -> None:
        if self._conversation is not None:
            with contextlib.suppress(Exception):
                self._conversation.close()
            self._conversation = None

    def _reset(self) -> None:
        self._stop_stream()
        old, self._session = self._session, None
        if old is not None:
            old.close()
        self._session = self._new_session(self.config)
        self._turn_tokens = 0
        held = {span.digest for span in self.media}  # (the spans the core still keeps)
        self._media_blobs = {d: b for d, b in self._media_blobs.items() if d in held}

    def _token_bytes(self, token_id: int) -> bytes:
        return self._loaded.tokenizer.piece(token_id)

    def _tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        # the engine's tokenizer always parses special tokens; text that must stay text is
        # encoded with the same tokenizer.json (prefill then refuses ids the engine would read
        # back as control tokens: it takes text)
        if parse_special:
            ids = list(self._loaded.engine.tokenize(text)) if text else []
        else:
            ids = self._loaded.tokenizer.encode(text, add_special=False, parse_special=False)
        bos = self.bos_token_id
        if add_special and bos is not None:
            ids = [bos, *ids]
        return ids

    def _close(self) -> None:
        self._stop_stream()
        self._close_conversation()
        if self._session is not None:
            self._session.close()
            self._session = None


__all__ = ["EngineSession", "LoadedEngine", "load_engine", "open_engine_session"]
