"""Contain llama.cpp's process aborts while a model file is being loaded.

llama.cpp trusts its input. A GGUF whose *values* are wrong (a duplicated token string, an
expert count without experts, a block count of 0, a tokenizer that does not match its
vocabulary ...) fails a ``GGML_ASSERT`` in the loader, or throws a C++ exception out of a C
function, and either one calls ``abort()``: the whole Python process dies. Re-implementing every
assertion of every architecture in Python would be both incomplete and slow (the vocabulary
alone is 262k strings on Gemma 3), so instead the native calls that read a file's values run on
a *sacrificial thread*:

* ggml's abort hook (``ggml_set_abort_callback``) and the C++ terminate handler
  (``std::set_terminate``) are replaced, once per process, by handlers that check whether the
  failing thread is one of ours;
* if it is, the handler records llama.cpp's message, wakes the caller, and parks that thread
  forever instead of returning into ``abort()``: the caller raises a typed error and the process
  carries on;
* on any other thread the handlers behave as before (print and abort), so nothing that used to
  crash loudly becomes silent.

What a contained abort costs: the parked thread (its stack, mostly untouched virtual memory) and
whatever the loader had allocated stay behind until the process exits (:func:`parked_threads`
counts them). llama.cpp's loader takes no locks, so later loads are unaffected (the fuzzer in
``tests/test_gguf_fuzz.py`` loads a good model after every contained abort to prove it). What a
good load costs: one thread start, about 0.1 ms.

Not contained: faults (SIGSEGV, SIGFPE) and aborts on threads this module did not start, e.g.
ggml's compute threads during ``llama_decode``. Values that only fail there are validated
before the first decode (:mod:`eliza_llamacpp.model_checks`).

Threads: :func:`contained` may be called from any thread; each call gets its own worker.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")

_ABORT_HOOK = ctypes.CFUNCTYPE(None, ctypes.c_char_p)
_TERMINATE_HANDLER = ctypes.CFUNCTYPE(None)
# Itanium C++ ABI name of std::set_terminate(void (*)()): libstdc++ and libc++ both export it.
_SET_TERMINATE = "_ZSt13set_terminatePFvvE"


class NativeAbort(Exception):
    """A native call aborted (on a contained thread); ``str()`` is llama.cpp's message,
    ``log_lines`` the warnings and errors it logged on that thread before."""

    def __init__(self, message: str, log_lines: list[str], stage: str) -> None:
        super().__init__(message)
        self.log_lines = log_lines
        self.stage = stage


class _Call(Generic[T]):
    """One contained call: its outcome, and what to do with a result nobody waits for."""

    def __init__(self, fn: Callable[[], T], release: Callable[[T], None] | None) -> None:
        self.fn = fn
        self.release = release
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.abandoned = False
        self.result: T | None = None
        self.error: BaseException | None = None
        self.abort_message: str | None = None
        self.log_lines: list[str] = []
        self.stage = "loading the model"

    def run(self) -> None:
        _guarded[threading.get_ident()] = self
        try:
            result = self.fn()
        except BaseException as exc:  # handed to the caller
            self.error = exc
        else:
            with self.lock:
                if self.abandoned:  # the caller was interrupted: free what it never got
                    if self.release is not None:
                        self.release(result)
                else:
                    self.result = result
        finally:
            _guarded.pop(threading.get_ident(), None)
            self.done.set()

    def aborted(self, message: str) -> None:
        """Called on the worker thread from inside ``abort()``: report, then never return."""
        global _parked
        self.abort_message = message
        _guarded.pop(threading.get_ident(), None)
        with _state_lock:
            _parked += 1
        self.done.set()
        park = threading.Lock()
        park.acquire()
        park.acquire()  # blocks forever (the GIL is released while it waits)


_guarded: dict[int, _Call[Any]] = {}
_state_lock = threading.Lock()
_installed = False
_terminate_contained = False
_MAX_LINES = 8
_parked = 0
_handlers: list[Any] = []  # ctypes callbacks must outlive every native caller
_previous_abort_hook: Any = None
_previous_terminate: Any = None


def _on_abort(message: bytes | None) -> None:
    text = (message or b"").decode("utf-8", "replace")
    call = _guarded.get(threading.get_ident())
    if call is not None:
        call.aborted(text)
    if _previous_abort_hook:
        _previous_abort_hook(message)
    else:  # ggml's default: the message on stderr, then abort()
        sys.stderr.write(text + "\n")
        sys.stderr.flush()


def _on_terminate() -> None:
    call = _guarded.get(threading.get_ident())
    if call is not None:
        call.aborted("a C++ exception escaped from a llama.cpp C function (std::terminate)")
    if _previous_terminate:
        _previous_terminate()
    os.abort()


def _find_library(name: str) -> str | None:
    import ctypes.util

    return ctypes.util.find_library(name)


def _libstdcxx() -> Any:
    # the usual sonames first: find_library runs ldconfig or a compiler (tens of ms), and
    # ctypes.util imports subprocess (and locale): only when they are not found
    names: list[Callable[[], str | None]] = [
        lambda: "libstdc++.so.6", lambda: "libc++.1.dylib",
        lambda: _find_library("stdc++"), lambda: _find_library("c++")]
    for name_of in names:
        name = name_of()
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
            getattr(lib, _SET_TERMINATE)
        except (OSError, AttributeError):
            continue
        return lib
    return None


def install() -> bool:
    """Install the two handlers (once per process; idempotent). Returns True when the C++
    terminate handler could be installed too (it needs libstdc++ or libc++ by name)."""
    global _installed, _previous_abort_hook, _previous_terminate, _terminate_contained
    with _state_lock:
        if _installed:
            return _terminate_contained
        from .bindings import lc

        # dlsym through libllama's handle finds the libggml-base that libllama really uses
        # (the wheel ships copies under several names; a second dlopen could load another)
        lib = lc._lib
        set_hook = lib.ggml_set_abort_callback
        set_hook.restype = ctypes.c_void_p
        set_hook.argtypes = [_ABORT_HOOK]
        hook = _ABORT_HOOK(_on_abort)
        previous = set_hook(hook)
        _previous_abort_hook = _ABORT_HOOK(previous) if previous else None
        _handlers.append(hook)
        stdcxx = _libstdcxx()
        if stdcxx is not None:
            set_terminate = getattr(stdcxx, _SET_TERMINATE)
            set_terminate.restype = ctypes.c_void_p
            set_terminate.argtypes = [_TERMINATE_HANDLER]
            handler = _TERMINATE_HANDLER(_on_terminate)
            prev = set_terminate(handler)
            _previous_terminate = _TERMINATE_HANDLER(prev) if prev else None
            _handlers.append(handler)
            _terminate_contained = True
        _installed = True
        return _terminate_contained


def contained(fn: Callable[[], T], *, name: str = "load",
              release: Callable[[T], None] | None = None) -> T:
    """Run ``fn()`` on a fresh worker thread and return its result (or raise its exception).

    If a native abort happens on that thread, raise :class:`NativeAbort` with llama.cpp's
    message instead of letting it end the process. ``release`` frees a result the caller never
    received (it was interrupted, e.g. by KeyboardInterrupt, while waiting: the interrupt is
    raised once the worker stopped, which ``fn`` hastens by polling :func:`keep_going`).
    """
    install()
    call: _Call[T] = _Call(fn, release)
    worker = threading.Thread(target=call.run, name=f"eliza-llamacpp-{name}", daemon=True)
    worker.start()
    try:
        call.done.wait()
    except BaseException:
        with call.lock:
            call.abandoned = True
        # the load stops at its next progress report (:func:`keep_going`): wait for that, so
        # the process never exits (running C++ static destructors) or frees the backend under a
        # thread still inside llama.cpp: that crashed ("pure virtual method called", SIGSEGV)
        # or hung when Ctrl-C landed in a load. A second interrupt stops the wait.
        call.done.wait()
        raise
    if call.abort_message is not None:
        raise NativeAbort(call.abort_message, call.log_lines, call.stage)
    if call.error is not None:
        raise call.error
    return call.result  # type: ignore[return-value]


def keep_going() -> bool:
    """False when the contained call running on this thread was abandoned (its caller was
    interrupted): llama.cpp's load progress callback returns it, so the load stops early."""
    call = _guarded.get(threading.get_ident())
    return call is None or not call.abandoned


def note(line: str) -> None:
    """Remember a warning or error llama.cpp logged, if the current thread is contained (the
    log callback calls this; :func:`logged` and :class:`NativeAbort` hand the lines on)."""
    call = _guarded.get(threading.get_ident())
    if call is not None:
        del call.log_lines[:-_MAX_LINES + 1]
        call.log_lines.append(line)


def stage(what: str) -> None:
    """Say what the current contained thread does next (named in a :class:`NativeAbort`)."""
    call = _guarded.get(threading.get_ident())
    if call is not None:
        call.stage = what


def logged() -> list[str]:
    """The warnings and errors llama.cpp logged so far on the current contained thread."""
    call = _guarded.get(threading.get_ident())
    return list(call.log_lines) if call is not None else []


def parked_threads() -> int:
    """How many contained aborts left a parked thread behind in this process."""
    return _parked


__all__ = ["NativeAbort", "contained", "install", "logged", "note", "parked_threads",
           "stage"]
