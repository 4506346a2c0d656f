"""The MLX session on mlx-lm: a model loaded once per context, one prompt cache per session.

Prefill runs the prompt through the model into the session's prompt cache
(``make_prompt_cache``) the way mlx-lm's ``generate_step`` does: every token but the last in
``config.batch_size``-token chunks, evaluated one by one with ``cancel()`` checked between them,
then the last token alone, whose logits give the first sample. Sampling uses mlx-lm's
``make_sampler`` and logits processors built from the :class:`StreamConfig`.

Decoding feeds ahead, as ``generate_step`` pipelines: once a token is sampled (lazily), its
forward pass and the sampling of the token after it are queued with ``mx.async_eval`` *before*
Python waits for the token's value, so the model computes while the core assembles text. Prefill
already queues the first token's forward pass (``_ahead``; taken back out of the cache with a
trim if a prefill, rewind or save comes first). A step of n tokens costs n forward passes; the
first token after a prefill is sampled straight from the prefill's logits. The prompt cache
holds the whole :attr:`Session.history` after a step, except when the step surely ends the
stream (the ``max_tokens`` budget or the context window): its last token is then kept back
(``_pending``) and fed with the next prefill, so no forward pass is spent on a token nothing
follows (an end-of-generation token cannot be foreseen and is fed ahead like any other).

Speculative decoding (``drafter="ngram"`` or ``"model"``, greedy only, trimmable caches only):
prefill keeps the prompt's last token back in ``_pending``. A round drafts ``k`` tokens (the
core's :class:`~eliza_backends.speculative.NgramDrafter`, or a draft MLX folder from
``text/draft/``, :mod:`eliza_mlx.mlx_draft`), runs ``[pending, d1..dk]`` through the model in
one call (logits for every position; ``[d1..dk]`` when the last token was already fed ahead and
its successor queued), takes the argmax per position, keeps the agreeing prefix plus the
target's own next token (:func:`~eliza_backends.speculative.accept_greedy`), trims the rejected
positions off the prompt cache and leaves the last produced token pending. A round with nothing
drafted decodes one token exactly as the plain path does (fed ahead, pipelined).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import struct
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import mlx.core as mx  # type: ignore[import-not-found,unused-ignore]
from mlx_lm.models.cache import (  # type: ignore[import-not-found,unused-ignore]
    can_trim_prompt_cache,
    load_prompt_cache,
    make_prompt_cache,
    save_prompt_cache,
    trim_prompt_cache,
)
from mlx_lm.sample_utils import (  # type: ignore[import-not-found,unused-ignore]
    make_logits_processors,
    make_sampler,
)
from mlx_lm.utils import load_model  # type: ignore[import-not-found,unused-ignore]

from eliza_backends import (
    BackendRuntimeError,
    BundleError,
    Capabilities,
    Decoded,
    InferenceContext,
    Session,
    SlotError,
    StreamConfig,
    UnsupportedOperationError,
)
from eliza_backends.hf_tokenizer import HFTokenizer
from eliza_backends.slots import fingerprint_artifact
from eliza_backends.speculative import Drafter, NgramDrafter, accept_greedy

from .probe import MLXFolder, check_mlx_folder

RUNTIME = (f"mlx {importlib.metadata.version('mlx')} / "
           f"mlx-lm {importlib.metadata.version('mlx-lm')}")
#: Compute runs on its own stream per thread, as in mlx-lm's generate_step.
_STREAM = mx.new_thread_local_stream(mx.default_device())
_SLOT_MAGIC = b"ELZMLX01"
_SLOT_HEAD = struct.Struct("<8sIQ")  # magic, cached tokens, prompt-cache file length


@dataclass
class LoadedMLX:
    """Weights and tokenizer of one MLX folder, shared by the sessions of a context."""

    folder: MLXFolder
    model: Any
    tokenizer: HFTokenizer
    vocab_size: int
    eog: frozenset[int]
    bos: int | None
    add_bos: bool
    chat_template: str | None
    template_tokens: dict[str, str]
    _fingerprint: str | None = None

    @property
    def fingerprint(self) -> str:
        """Cheap identity of the folder (see :func:`fingerprint_artifact`)."""
        if self._fingerprint is None:
            self._fingerprint = fingerprint_artifact(self.folder.path)
        return self._fingerprint


def _ids(value: Any) -> set[int]:
    if isinstance(value, bool):
        return set()
    if isinstance(value, int):
        return {value}
    if isinstance(value, list):
        return {v for v in value if isinstance(v, int) and not isinstance(v, bool)}
    return set()


def _json_or_empty(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _token_content(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def load_weights(folder: MLXFolder) -> LoadedMLX:
    """Load an already validated MLX folder with mlx-lm (errors become :class:`BundleError`)."""
    tokenizer = HFTokenizer.from_file(folder.path / "tokenizer.json")
    try:
        model, _config = load_model(folder.path)
    except Exception as exc:
        raise BundleError(f"mlx-lm could not load {folder.path}: {type(exc).__name__}: {exc} "
                          "(unsupported architecture, or weights that do not match config.json)"
                          ) from None
    vocab = folder.vocab_size
    tok_config = _json_or_empty(folder.path / "tokenizer_config.json")
    gen_config = _json_or_empty(folder.path / "generation_config.json")
    eog = _ids(folder.config.get("eos_token_id")) | _ids(gen_config.get("eos_token_id"))
    eos_text = _token_content(tok_config.get("eos_token"))
    if eos_text is not None and (eos_id := tokenizer.token_id(eos_text)) is not None:
        eog.add(eos_id)
    bos: int | None = None
    bos_ids = _ids(folder.config.get("bos_token_id")) or _ids(gen_config.get("bos_token_id"))
    bos_text = _token_content(tok_config.get("bos_token"))
    if bos_ids:
        bos = min(bos_ids)
    elif bos_text is not None:
        bos = tokenizer.token_id(bos_text)
    probe = tokenizer.encode("a", add_special=True)
    add_bos = bos is not None and bool(probe) and probe[0] == bos and \
        tokenizer.encode("a", add_special=False)[:1] != [bos]
    template_file = folder.path / "chat_template.jinja"
    template: str | None = None
    if template_file.is_file():
        template = template_file.read_text(encoding="utf-8")
    elif isinstance(tok_config.get("chat_template"), str):
        template = tok_config["chat_template"]
    return LoadedMLX(folder=folder, model=model, tokenizer=tokenizer, vocab_size=vocab,
                     eog=frozenset(t for t in eog if 0 <= t < vocab), bos=bos, add_bos=add_bos,
                     chat_template=template,
                     template_tokens={k: v for k, v in (("bos_token", bos_text),
                                                         ("eos_token", eos_text)) if v})


def open_session(context: InferenceContext, config: StreamConfig, path: Path,
                 draft_path: Path | None = None) -> MLXSession:
    """Validate the folder, load (or reuse) its weights on ``context``, open a session (with
    the drafter ``config.drafter`` names; ``draft_path``: the draft MLX folder for "model")."""
    if config.drafter != "none" and (not config.greedy or config.repeat_penalty != 1.0):
        raise UnsupportedOperationError(
            "mlx speculative decoding is greedy-only here: use temperature=0 and "
            "repeat_penalty=1 with a drafter, or drafter='none' to sample")
    folder = check_mlx_folder(path)
    loaded = context.shared(("mlx", str(path)), lambda: load_weights(folder))
    drafter: Drafter | None = None
    if config.drafter == "ngram":
        drafter = NgramDrafter(max_n=config.ngram_size)
    elif config.drafter == "model":
        if draft_path is None:
            raise BundleError("drafter='model' needs a draft MLX folder (text/draft/ or "
                              "draft_model)")
        from .mlx_draft import open_draft

        drafter = open_draft(context, config, draft_path, loaded.vocab_size)
    return MLXSession(loaded, config, context, drafter)


def _trim(cache: list[Any], n: int) -> int:
    """Trim ``n`` tokens off every layer; how many were trimmed (mlx-lm annotates the return
    value of ``trim_prompt_cache`` as a list, but it is the count)."""
    return int(cast(Any, trim_prompt_cache(cache, n)))


def _greedy(logits: Any) -> Any:
    return mx.argmax(logits, axis=-1)


class MLXSession(Session):
    """An mlx-lm generation: one prompt cache (KV per layer) on the shared model."""

    backend_name = "mlx-coreml"

    def __init__(self, loaded: LoadedMLX, config: StreamConfig,
                 context: InferenceContext | None, drafter: Drafter | None = None) -> None:
        self._loaded = loaded
        self._model = loaded.model
        self._cache: list[Any] = make_prompt_cache(loaded.model)
        self._trimmable = bool(can_trim_prompt_cache(self._cache))
        if drafter is not None and not self._trimmable:
            drafter.close()
            raise UnsupportedOperationError(
                f"{loaded.folder.path.name}: this model's prompt cache cannot be trimmed, so it "
                "cannot verify drafts (capabilities.drafters is {'none'}); use drafter='none'")
        self._drafter = drafter
        self._greedy = config.greedy
        self._sampler: Callable[[Any], Any] = _greedy if config.greedy else make_sampler(
            temp=config.temperature, top_p=config.top_p, min_p=config.min_p,
            top_k=config.top_k)
        self._processors: list[Callable[[Any, Any], Any]] = []
        self._last_n = 0
        if config.repeat_penalty != 1.0 and config.repeat_last_n > 0:
            self._last_n = config.repeat_last_n
            self._processors = make_logits_processors(
                repetition_penalty=config.repeat_penalty,
                repetition_context_size=config.repeat_last_n)
        self._n_kv = 0  # positions in the prompt cache (len(history), or one less: _pending)
        self._pending: int | None = None  # the stream's last token, not fed (nothing follows)
        # (token, logits it was sampled from): prefill already queued the forward pass of the
        # first token to come, which is in the cache but not yet in the history
        self._ahead: tuple[Any, Any] | None = None
        self._logits: Any = None  # logits after the last cached token, shape (1, vocab)
        self._y: Any = None  # the next token, sampled (lazily) from _logits
        self._stale = False  # the cache could not be rolled back: only reset() helps
        super().__init__(config, context)
        self._seed()

    # ------------------------------------------------------------------ facts

    @property
    def vocab_size(self) -> int:
        return self._loaded.vocab_size

    @property
    def context_size(self) -> int:
        return self.config.context_size

    @property
    def eog_token_ids(self) -> frozenset[int]:
        return self._loaded.eog

    @property
    def bos_token_id(self) -> int | None:
        return self._loaded.bos if self._loaded.add_bos else None

    @property
    def chat_template(self) -> str | None:
        """The folder's chat template (chat_template.jinja or tokenizer_config.json)."""
        return self._loaded.chat_template

    @property
    def template_tokens(self) -> dict[str, str]:
        """``bos_token`` / ``eos_token`` texts from tokenizer_config.json."""
        return dict(self._loaded.template_tokens)

    @property
    def capabilities(self) -> Capabilities:
        drafters = {"none", "ngram", "model"} if self._trimmable else {"none"}
        return Capabilities(token_input=True, prefix_reuse=True, slots=True,
                            cancel_prefill=False, sampling=True, drafters=frozenset(drafters))

    # ------------------------------------------------------------------ sampling

    def _seed(self) -> None:
        # mlx's sampling PRNG is process-global: reseeded on open and on every rewind.
        if not self._greedy:
            mx.random.seed(self.config.seed)

    def _tail(self, ids: list[int], lazy: Any = None) -> Any:
        """The recent tokens the repetition penalty looks at (``lazy``: a pending token)."""
        keep = self._last_n - (1 if lazy is not None else 0)
        recent = ids[-keep:] if keep > 0 else []
        tail = mx.array(recent, dtype=mx.uint32) if recent else None
        if lazy is None:
            return tail
        return lazy if tail is None else mx.concatenate([tail, lazy])

    def _launch(self, logits: Any, tail: Any) -> None:
        """Queue the sampling of the next token from ``logits`` (not waited for)."""
        self._logits = logits
        if self._processors and tail is not None:
            for processor in self._processors:
                logits = processor(tail, logits)
        if not self._greedy:
            logits = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        self._y = self._sampler(logits)
        mx.async_eval(self._y)  # type: ignore[no-untyped-call,unused-ignore]

    # ------------------------------------------------------------------ hooks

    def _prefill(self, token_ids: list[int]) -> None:
        if self._stale:
            raise BackendRuntimeError("the MLX prompt cache was lost by an interrupted call; "
                                      "call reset() before prefilling again")
        self._undo_ahead()
        model, cache, step = self._model, self._cache, self.config.batch_size
        start = self._n_kv
        history = list(self._history)
        feed = token_ids if self._pending is None else [self._pending, *token_ids]
        # As generate_step: every token but the last in chunks (evaluated, cancel between
        # them), then the last token alone, whose logits give the first sample.
        body, last = feed[:-1], feed[-1:]
        try:
            with mx.stream(_STREAM):
                for off in range(0, len(body), step):
                    self._raise_if_cancelled()
                    chunk = body[off:off + step]
                    model(mx.array(chunk, dtype=mx.uint32)[None], cache=cache)
                    self._n_kv = start + off + len(chunk)
                    mx.eval([c.state for c in cache])
                    mx.clear_cache()  # as generate_step: drop the chunk's temporaries
                self._raise_if_cancelled()
                if self._drafter is not None:  # speculative: the first round verifies it
                    self._logits = self._y = None
                    self._pending = last[0]
                    return
                out = model(mx.array(last, dtype=mx.uint32)[None], cache=cache)
                self._n_kv += 1
                tail = self._tail(history + token_ids) if self._processors else None
                self._launch(out[:, -1, :], tail)
                if self._trimmable:  # queue the first token's forward pass now, as
                    y, logits = self._y, self._logits  # generate_step does (undone by
                    nxt = model(y[None], cache=cache)[:, -1, :]  # _undo_ahead)
                    self._n_kv += 1
                    self._launch(nxt, self._tail(history + token_ids, y)
                                 if self._processors else None)
                    self._ahead = (y, logits)
                    mx.eval(y)
                else:
                    mx.eval(self._y)
        except BaseException:
            self._rollback(start)
            raise
        self._pending = None

    def _undo_ahead(self) -> None:
        """Take the token prefill fed ahead back out of the cache (nothing consumed it)."""
        if self._ahead is None:
            return
        y, logits = self._ahead
        self._ahead = None
        if _trim(self._cache, 1) != 1:
            self._stale = True
            return
        self._n_kv -= 1
        self._y, self._logits = y, logits  # (a sampler draw was spent: deterministic still)

    def _rollback(self, n: int) -> None:
        self._logits = self._y = None
        extra = self._n_kv - n
        if extra > 0:
            if can_trim_prompt_cache(self._cache) and _trim(self._cache, extra) == extra:
                self._n_kv = n
            else:
                self._stale = True

    def _decode(self, max_tokens: int) -> Decoded:
        if self._drafter is not None:
            return self._decode_speculative(self._drafter, max_tokens)
        out: list[int] = []
        model, cache, cancel = self._model, self._cache, self._cancel
        eog = self._loaded.eog
        stop_at_eog = not self.config.ignore_eos
        processors = bool(self._processors)
        # The stream surely ends after this step (budget or context): its last token is not fed
        # ahead, it waits in _pending for a prefill that continues the sequence.
        ends = max_tokens >= self.config.max_tokens - self._generated or \
            len(self._history) + max_tokens >= self.context_size
        with mx.stream(_STREAM):
            for i in range(max_tokens):
                if i and cancel.is_set():
                    self._raise_if_cancelled()
                if self._ahead is not None:  # prefill queued this token's forward pass
                    y, self._ahead = self._ahead[0], None
                    tok = y.item()
                else:
                    y = self._y
                    if ends and i == max_tokens - 1:
                        tok = y.item()
                        out.append(tok)
                        self._pending, self._y, self._logits = tok, None, None
                        break
                    logits = model(y[None], cache=cache)[:, -1, :]
                    self._n_kv += 1
                    tail = self._tail(self._history + out, y) if processors else None
                    self._launch(logits, tail)
                    tok = y.item()
                out.append(tok)
                if not self._n_kv & 255:
                    mx.clear_cache()  # as generate_step, every 256 tokens
                if stop_at_eog and tok in eog:
                    break
        return Decoded(out)

    def _decode_speculative(self, drafter: Drafter, max_tokens: int) -> Decoded:
        """Rounds of: draft k tokens, verify them in one model call, keep the agreeing prefix
        plus the target's next token, trim the rejected positions off the prompt cache.

        Between rounds the sequence's last token is either *pending* (not in the cache: the
        next round verifies ``[pending, d1..dk]``) or *fed ahead* (in the cache, the target's
        next token queued lazily in ``ahead``: the round verifies ``[d1..dk]`` and ``ahead`` is
        the target for d1). A round whose drafter proposes nothing decodes one token the way
        the plain path does, feeding it ahead before waiting for it, so a drafter with nothing
        to say keeps the plain path's pipelining.
        """
        self._undo_ahead()
        if self._stale:
            raise BackendRuntimeError("the MLX prompt cache was lost by an interrupted call; "
                                      "call reset() before decoding again")
        model, cache, cancel = self._model, self._cache, self._cancel
        ahead: Any = None  # the target's token after the sequence, when its last token is fed
        if self._pending is None:  # the cache holds the whole history
            if self._y is not None:
                ahead = self._y
            else:  # (after save_slot) take its last token back out to verify it with drafts
                if _trim(cache, 1) != 1:
                    self._stale = True
                    raise BackendRuntimeError("the MLX prompt cache could not be trimmed")
                self._n_kv -= 1
                self._pending = self._history[-1]
        self._logits = self._y = None
        eog = self._loaded.eog
        stop_at_eog = not self.config.ignore_eos
        draft_length = self.config.draft_length
        # as _decode: when the stream surely ends with this step, its last token is not fed
        ends = max_tokens >= self.config.max_tokens - self._generated or \
            len(self._history) + max_tokens >= self.context_size
        seq = list(self._history)
        out: list[int] = []
        drafted = accepted = 0

        def is_end(tok: int) -> bool:
            return stop_at_eog and tok in eog

        while len(out) < max_tokens:
            if out and cancel.is_set():
                self._raise_if_cancelled()
            k = min(draft_length, max_tokens - len(out) - 1)
            drafts = drafter.propose(seq, k) if k > 0 else []
            start = self._n_kv
            pending = self._pending
            try:
                with mx.stream(_STREAM):
                    if ahead is None:  # feed the pending token (with the drafts, if any)
                        logits = model(mx.array([pending, *drafts], dtype=mx.uint32)[None],
                                       cache=cache)
                        self._n_kv += 1 + len(drafts)
                        self._pending = None
                        targets = _greedy(logits[0])
                        last = start  # cache position of the sequence's last token
                    elif drafts:
                        logits = model(mx.array(drafts, dtype=mx.uint32)[None], cache=cache)
                        self._n_kv += len(drafts)
                        targets = mx.concatenate([ahead, _greedy(logits[0])])
                        last = start - 1
                    else:
                        targets = ahead
                        last = start - 1
                    if not drafts:  # one token, fed ahead before waiting for it (as _decode)
                        y = targets[-1:]
                        if ends and len(out) + 1 == max_tokens:
                            ahead = None
                            tok = y.item()
                            self._pending = tok
                        else:
                            ahead = _greedy(model(y[None], cache=cache)[:, -1, :])
                            self._n_kv += 1
                            mx.async_eval(ahead)  # type: ignore[no-untyped-call,unused-ignore]
                            tok = y.item()
                        out.append(tok)
                        seq.append(tok)
                        if not self._n_kv & 255:
                            mx.clear_cache()  # as generate_step, every 256 tokens
                        if is_end(tok):
                            break
                        continue
                    verdict = cast(list[int], targets.tolist())
            except BaseException:
                self._rollback(start)
                self._pending = pending
                if out:  # tokens this step made are in the cache, not in the history
                    self._stale = True
                raise
            produced, n_ok = accept_greedy(drafts, verdict.__getitem__, is_end)
            keep = last + len(produced)  # up to the last accepted draft; produced[-1] pends
            extra = self._n_kv - keep  # the rejected drafts (and a fed end token)
            if extra and _trim(cache, extra) != extra:
                self._stale = True
                raise BackendRuntimeError("the MLX prompt cache could not be trimmed")
            if keep >> 8 != start >> 8:
                mx.clear_cache()  # as generate_step, every 256 tokens
            self._n_kv = keep
            self._pending = produced[-1]
            ahead = None
            out.extend(produced)
            seq.extend(produced)
            drafted += len(drafts)
            accepted += n_ok
            if is_end(produced[-1]):
                break
        if ahead is not None:  # the plain path's state: the whole sequence cached, next queued
            self._y = ahead
        return Decoded(out, drafted, accepted)

    def _reset(self) -> None:
        if self._drafter is not None:
            self._drafter.truncate(0)
        self._cache = make_prompt_cache(self._model)
        self._n_kv = 0
        self._pending = self._ahead = None
        self._logits = self._y = None
        self._stale = False
        self._seed()

    def _truncate(self, n_keep: int) -> bool:
        if self._drafter is not None:
            self._drafter.truncate(n_keep)
        self._undo_ahead()
        if self._stale:
            return False
        drop = self._n_kv - n_keep
        if drop > 0:
            if not can_trim_prompt_cache(self._cache):
                return False
            if _trim(self._cache, drop) != drop:
                return False
            self._n_kv = n_keep
            self._pending = None
        elif drop == 0:
            self._pending = None
        elif not (drop == -1 and self._pending is not None):  # else: keep the pending token
            return False
        self._logits = self._y = None
        self._seed()
        return True

    def _token_bytes(self, token_id: int) -> bytes:
        return self._loaded.tokenizer.piece(token_id)

    def _tokenize(self, text: str, add_special: bool) -> list[int]:
        return self._loaded.tokenizer.encode(text, add_special=add_special)

    # ------------------------------------------------------------------ slots

    def _slot_identity(self) -> tuple[str, str]:
        return self._loaded.fingerprint, RUNTIME

    def _save_state(self) -> bytes:
        """mlx-lm's prompt-cache safetensors file, plus the logits of the last token."""
        self._undo_ahead()
        if self._pending is not None and not self._stale:  # feed the stream's last token
            with mx.stream(_STREAM):
                out = self._model(mx.array([self._pending], dtype=mx.uint32)[None],
                                  cache=self._cache)
                self._n_kv += 1
                self._pending = None
                self._logits = out[:, -1, :]
                mx.eval(self._logits)
        if self._stale or self._n_kv != len(self._history):
            raise SlotError("the MLX prompt cache does not match the history (interrupted "
                            "call); reset() or prefill again before saving")
        if self._logits is None:  # after reset_keep: recompute the last token's logits
            if not can_trim_prompt_cache(self._cache):
                raise SlotError("this model's cache cannot be trimmed; prefill before saving")
            with mx.stream(_STREAM):
                _trim(self._cache, 1)
                out = self._model(mx.array(self._history[-1:], dtype=mx.uint32)[None],
                                  cache=self._cache)
                self._logits = out[:, -1, :]
                mx.eval(self._logits)
        with tempfile.TemporaryDirectory(prefix="eliza-mlx-slot-") as tmp:
            cache_file = os.path.join(tmp, "cache.safetensors")
            logits_file = os.path.join(tmp, "logits.safetensors")
            save_prompt_cache(cache_file, self._cache, {"eliza_n_kv": str(self._n_kv)})
            mx.save_safetensors(logits_file, {"logits": self._logits})
            cache_bytes = Path(cache_file).read_bytes()
            logits_bytes = Path(logits_file).read_bytes()
        return _SLOT_HEAD.pack(_SLOT_MAGIC, self._n_kv, len(cache_bytes)) + cache_bytes + \
            logits_bytes

    def _restore_state(self, payload: bytes, tokens: list[int]) -> None:
        if len(payload) < _SLOT_HEAD.size:
            raise SlotError("slot payload is too short for an MLX state")
        magic, n_kv, cache_len = _SLOT_HEAD.unpack_from(payload)
        body = payload[_SLOT_HEAD.size:]
        if magic != _SLOT_MAGIC or cache_len > len(body):
            raise SlotError("slot payload is not an MLX prompt-cache state")
        if n_kv != len(tokens):
            raise SlotError(f"slot says {n_kv} cached tokens for a history of {len(tokens)}")
        with tempfile.TemporaryDirectory(prefix="eliza-mlx-slot-") as tmp:
            cache_file = os.path.join(tmp, "cache.safetensors")
            logits_file = os.path.join(tmp, "logits.safetensors")
            Path(cache_file).write_bytes(body[:cache_len])
            Path(logits_file).write_bytes(body[cache_len:])
            try:
                cache = load_prompt_cache(cache_file)  # type: ignore[no-untyped-call,unused-ignore]
                loaded = mx.load(logits_file)
                if not isinstance(loaded, dict) or "logits" not in loaded:
                    raise ValueError("no logits in the saved state")
                logits: Any = loaded["logits"]
                mx.eval(logits, [c.state for c in cache])
            except Exception as exc:
                raise SlotError(f"mlx-lm could not read the saved prompt cache: {exc}") from None
        fresh = make_prompt_cache(self._model)
        if len(cache) != len(fresh) or any(type(a) is not type(b)
                                            for a, b in zip(cache, fresh, strict=True)):
            raise SlotError("the saved prompt cache does not fit this model's layers")
        offsets = {getattr(c, "offset", n_kv) for c in cache}
        if offsets != {n_kv} or tuple(logits.shape) != (1, self._loaded.vocab_size):
            raise SlotError("the saved prompt cache does not match its token history")
        if self._drafter is not None:
            self._drafter.truncate(0)
        self._cache = cache
        self._n_kv = n_kv
        self._pending = self._ahead = None
        self._stale = False
        self._seed()
        with mx.stream(_STREAM):
            self._launch(logits, self._tail(tokens) if self._processors else None)
            mx.eval(self._y)

    # ------------------------------------------------------------------ teardown

    def _close(self) -> None:
        if self._drafter is not None:
            self._drafter.close()
            self._drafter = None
        self._cache = []
        self._logits = self._y = None


__all__ = ["RUNTIME", "LoadedMLX", "MLXSession", "load_weights", "open_session"]
