"""The token-exact session's KV cache, held one of two ways (chosen by the ``runtime`` option):

* :class:`NumpyKV`: numpy arrays passed into and out of each Interpreter signature call;
* :class:`BufferKV`: LiteRT TensorBuffers owned by the session, updated in place by the
  CompiledModel (each buffer is both input and output): no copy of the cache per call.

Both run one signature call per method, holding the model's lock (the runtime is shared).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np

from eliza_backends import BackendRuntimeError

from .model import LoadedModel


def run(what: str, call: Any, *args: Any, **kwargs: Any) -> Any:
    """One runtime call; its RuntimeError / ValueError / MemoryError (a model that does not
    prepare or run: inconsistent shapes, a tensor that cannot be allocated) becomes a typed
    error instead of escaping raw."""
    try:
        return call(*args, **kwargs)
    except (RuntimeError, ValueError, MemoryError) as exc:
        raise BackendRuntimeError(f"LiteRT failed to run {what}: {exc}. The model is "
                                  "inconsistent or corrupted; export it again") from None


class GilHandover:
    """Lets other Python threads in between CompiledModel runs, once per switch interval.

    The CompiledModel holds the GIL through each run (the Interpreter releases it), and the
    numpy calls between runs (the sampler's argmax) release it for microseconds at a time.
    CPython asks a running thread for the GIL only after a waiting thread saw a whole switch
    interval pass with no switch, and each of those brief releases counts as one: a waiting
    thread (a ``cancel()``, a server's event loop) then waited for the whole call, 40 ms of
    decode and more. :meth:`after_run` releases the GIL (``sleep(0)``) once per
    ``sys.getswitchinterval()``: a waiting thread takes it then, and a lone thread pays one
    system call per interval (5 ms by default)."""

    __slots__ = ("_due",)

    def __init__(self) -> None:
        self._due = 0.0

    def after_run(self) -> None:
        """Call after each run, outside the model's lock."""
        now = time.perf_counter()
        if now >= self._due:
            time.sleep(0)
            self._due = now + sys.getswitchinterval()


class NumpyKV:
    """The KV cache as numpy arrays passed into and out of each Interpreter call."""

    def __init__(self, model: LoadedModel) -> None:
        self.model = model
        self.cache = {k: np.zeros(shape, dtype=dt) for k, (shape, dt) in
                      model.cache_specs.items()}

    def prefill(self, size: int, tokens: Any, positions: Any, mask: Any) -> None:
        with self.model.lock:
            self.cache = run(f"prefill_{size}", self.model.prefill[size], tokens=tokens,
                             input_pos=positions, mask=mask, **self.cache)

    def decode(self, tokens: Any, positions: Any, mask: Any) -> Any:
        with self.model.lock:
            out = run("decode", self.model.decode, tokens=tokens, input_pos=positions, mask=mask,
                      **self.cache)
        logits = out.pop("logits")[0, -1]
        self.cache = out
        return logits

    def arrays(self) -> dict[str, Any]:
        return self.cache

    def load(self, arrays: dict[str, Any]) -> None:
        self.cache = arrays

    def close(self) -> None:
        self.cache = {}


class BufferKV:
    """The KV cache in LiteRT TensorBuffers owned by the session, updated in place by the
    CompiledModel (each buffer is both input and output): no copy of the cache per call."""

    def __init__(self, model: LoadedModel) -> None:
        self.model = model
        cm = model.interpreter
        self.kv = {}
        for name, (shape, dt) in model.cache_specs.items():
            buf = cm.create_input_buffer_by_name("decode", name)
            buf.write(np.zeros(shape, dtype=dt))  # fresh memory may hold NaNs the mask can't hide
            self.kv[name] = buf
        self.small: dict[tuple[str, str], Any] = {}
        self.logits = cm.create_output_buffer_by_name("decode", "logits")
        self._handover = GilHandover()

    def _inputs(self, sig: str, tokens: Any, positions: Any, mask: Any) -> dict[str, Any]:
        cm = self.model.interpreter
        ins = {}
        for name, value in (("tokens", tokens), ("input_pos", positions), ("mask", mask)):
            buf = self.small.get((sig, name))
            if buf is None:
                buf = self.small[(sig, name)] = cm.create_input_buffer_by_name(sig, name)
            buf.write(np.ascontiguousarray(value))
            ins[name] = buf
        return {**ins, **self.kv}

    def prefill(self, size: int, tokens: Any, positions: Any, mask: Any) -> None:
        sig = self.model.prefill[size]
        with self.model.lock:
            run(sig, self.model.interpreter.run_by_name, sig,
                run(sig, self._inputs, sig, tokens, positions, mask), dict(self.kv))
        self._handover.after_run()

    def decode(self, tokens: Any, positions: Any, mask: Any) -> Any:
        with self.model.lock:
            run("decode", self.model.interpreter.run_by_name, "decode",
                run("decode", self._inputs, "decode", tokens, positions, mask),
                {"logits": self.logits, **self.kv})
            logits = self.logits.read(self.model.info.vocab_size, np.float32)
        self._handover.after_run()
        return logits

    def arrays(self) -> dict[str, Any]:
        out = {}
        for name, (shape, dt) in self.model.cache_specs.items():
            out[name] = self.kv[name].read(int(np.prod(shape)), dt).reshape(shape)
        return out

    def load(self, arrays: dict[str, Any]) -> None:
        for name, value in arrays.items():
            self.kv[name].write(np.ascontiguousarray(value))

    def close(self) -> None:
        self.kv, self.small = {}, {}


__all__ = ["BufferKV", "GilHandover", "NumpyKV", "run"]
