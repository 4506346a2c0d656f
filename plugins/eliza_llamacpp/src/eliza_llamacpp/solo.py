"""A session's own ``llama_context``: one sequence (0), decoded on the session's thread.

The :class:`~eliza_llamacpp.lane.Lane` of a session opened with ``parallel=1`` (or by a backend
call outside a batched context). Prefills go in pieces of the context's batch size with
llama.cpp's abort callback installed (a cancel stops a running ``llama_decode`` within
milliseconds); a one-token decode uses a preallocated one-token batch. A drafter that reads this
context (Gemma 4's MTP assistant: :class:`~eliza_llamacpp.lane.TargetLinkedDrafter`) is told of
every decode.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from eliza_backends import BackendRuntimeError, CancelledError, StreamConfig

if TYPE_CHECKING:  # imported by the batched path only (issue 42)
    from eliza_backends.backend import StepScheduler

from .bindings import lc
from .lane import TargetLinkedDrafter
from .llama_context import Outputs, fill_batch, load_seq, new_context, one_token_batch, save_seq
from .model import LoadedModel
from .options import LlamaCppOptions

R = TypeVar("R")
_DECODE_ABORTED = 2


def check_decode(status: int, cancelled: Callable[[], bool]) -> None:
    """Raise for a failed ``llama_decode`` status: :class:`CancelledError` when the abort
    callback stopped it for a cancel, else :class:`BackendRuntimeError`."""
    if status == 0:
        return
    if status == _DECODE_ABORTED and cancelled():
        raise CancelledError("the decode was cancelled")
    raise BackendRuntimeError(f"llama_decode failed with status {status}"
                              + (" (no KV slot: context full)" if status == 1 else ""))


class SoloLane:
    """Sequence 0 of a ``llama_context`` the lane owns (see the module docstring)."""

    batched = False
    keeps_logits = True

    def __init__(self, model: LoadedModel, config: StreamConfig, options: LlamaCppOptions
                 ) -> None:
        self.ctx: Any = new_context(model, config, "a context", n_ubatch=options.n_ubatch,
                                    flash_attention=options.flash_attention,
                                    kv_cache_type=options.kv_cache_type)
        self.mem = lc.llama_get_memory(self.ctx)
        self.n_batch: int = lc.llama_n_batch(self.ctx)
        self.n_ctx: int = lc.llama_n_ctx(self.ctx)
        self.draft_cap = self.n_batch - 1
        self.scheduler: StepScheduler | None = None
        self.batch: Any = lc.llama_batch_init(self.n_batch, 0, 1)
        self._one: Any = one_token_batch()
        #: The session's C-level abort callback (set once the session exists).
        self.abort: Any = None
        #: A drafter reading this context, told of every decode (Gemma 4's MTP assistant).
        self.linked: TargetLinkedDrafter | None = None

    def decode(self, tokens: list[int], start: int, outputs: Outputs,
               then: Callable[[int], R], cancelled: Callable[[], bool]) -> R:
        """See :meth:`eliza_llamacpp.lane.Lane.decode`."""
        ctx, linked = self.ctx, self.linked
        if len(tokens) == 1 and outputs != "none":  # the hot path: the sampled token
            one = self._one
            one.token[0] = tokens[0]
            one.pos[0] = start
            status = lc.llama_decode(ctx, one)
            if status:
                check_decode(status, cancelled)
            if linked is not None:
                linked.target_decoded(start, tokens, "last")
            return then(0)
        if outputs == "all":
            fill_batch(self.batch, tokens, start, "all")
            check_decode(lc.llama_decode(ctx, self.batch), cancelled)
            if linked is not None:
                linked.target_decoded(start, tokens, "all")
            return then(len(tokens) - 1)
        return then(self._pieces(tokens, start, outputs, cancelled))

    def _pieces(self, tokens: list[int], start: int, outputs: Outputs,
                cancelled: Callable[[], bool]) -> int:
        """A prefill in pieces of the batch size, cancellable inside ``llama_decode``;
        returns the last token's row."""
        ctx, batch, cap, linked = self.ctx, self.batch, self.n_batch, self.linked
        if self.abort is not None:
            lc.llama_set_abort_callback(ctx, self.abort, None)
        try:
            last = 0
            for off in range(0, len(tokens), cap):
                if cancelled():
                    raise CancelledError("the prefill was cancelled")
                chunk = tokens[off:off + cap]
                piece: Outputs = outputs if off + len(chunk) == len(tokens) else "none"
                fill_batch(batch, chunk, start + off, piece)
                check_decode(lc.llama_decode(ctx, batch), cancelled)
                if linked is not None:
                    linked.target_decoded(start + off, chunk, piece)
                last = len(chunk) - 1
            return last
        finally:
            if self.abort is not None:
                lc.llama_set_abort_callback(ctx, lc.ggml_abort_callback(), None)

    def media(self, start: int, run: Callable[[Any, int, int], int], mark: int) -> int:
        """See :meth:`eliza_llamacpp.lane.Lane.media` (cancellable inside ``llama_decode``)."""
        ctx = self.ctx
        if self.abort is not None:
            lc.llama_set_abort_callback(ctx, self.abort, None)
        try:
            return run(ctx, 0, start)
        finally:
            if self.abort is not None:
                lc.llama_set_abort_callback(ctx, lc.ggml_abort_callback(), None)

    def drop(self, p0: int) -> bool:
        """See :meth:`eliza_llamacpp.lane.Lane.drop`."""
        return bool(lc.llama_memory_seq_rm(self.mem, 0, p0, -1))

    def clear(self) -> None:
        """See :meth:`eliza_llamacpp.lane.Lane.clear`."""
        lc.llama_memory_clear(self.mem, True)

    def pos_max(self) -> int:
        """See :meth:`eliza_llamacpp.lane.Lane.pos_max`."""
        return int(lc.llama_memory_seq_pos_max(self.mem, 0))

    def pos_min(self) -> int:
        """See :meth:`eliza_llamacpp.lane.Lane.pos_min`."""
        return int(lc.llama_memory_seq_pos_min(self.mem, 0))

    def save(self) -> memoryview:
        """See :meth:`eliza_llamacpp.lane.Lane.save`."""
        return save_seq(self.ctx, 0)

    def load(self, state: bytes | memoryview, tokens: Sequence[int]) -> bool:
        """See :meth:`eliza_llamacpp.lane.Lane.load`."""
        self.clear()
        return load_seq(self.ctx, 0, state)

    def idle(self) -> None:
        """Nothing to tell: the lane decodes only when asked."""

    def batch_cost(self, token: int, n_kv: int, max_n: int) -> list[float] | None:
        """Time ``llama_decode`` over n = 1..max_n copies of ``token`` at the free positions
        after ``n_kv`` (logits for all), dropping them after each call. The sizes take turns
        (1, 2, .. max_n, 1, 2, ..; one unmeasured turn first) so that a busy spell on a shared
        machine hits every size alike, and each size keeps its fastest of 4 (the minimum is
        the cost, the rest is other work). The curve is not made monotone: ggml's repacked
        quantized matmuls take rows in groups, so a longer batch can cost less than a shorter
        one (Gemma 3 270M Q4_K_M, 1 thread: 4 tokens 3.1x one, 3 tokens 4.3x), and the policy
        should see that."""
        batch, ctx = self.batch, self.ctx
        max_n = min(max_n, self.n_batch)
        if max_n < 2:
            return None
        best = [float("inf")] * max_n
        try:
            for turn in range(5):
                for n in range(1, max_n + 1):
                    fill_batch(batch, [token] * n, n_kv, "all")
                    t0 = time.perf_counter()
                    status = lc.llama_decode(ctx, batch)
                    dt = time.perf_counter() - t0
                    self.drop(n_kv)
                    if status:
                        return None
                    if turn:
                        best[n - 1] = min(best[n - 1], dt)
        finally:
            self.drop(n_kv)
        return best

    def close(self) -> None:
        """Free the batches and the context."""
        if self.batch is not None:
            lc.llama_batch_free(self.batch)
            lc.llama_batch_free(self._one)
            self.batch = self._one = None
        if self.ctx is not None:
            lc.llama_free(self.ctx)
            self.ctx = None


__all__ = ["SoloLane", "check_decode"]
