"""Native runtimes' stderr, captured and routed into :mod:`logging`.

Some runtimes write their own log lines straight to file descriptor 2, past every Python-level
switch: LiteRT prints ~37 INFO/WARNING lines (environment creation, the accelerator registry,
a failed OpenVINO compiler-plugin load) whenever a model is opened, and neither
``TF_CPP_MIN_LOG_LEVEL`` nor LiteRT-LM's ``set_min_log_severity`` reach them.
:func:`native_stderr_to_logging` points fd 2 at a temporary file for the duration of such a
call, then replays every captured line to a :class:`logging.Logger` at the level its prefix
names (``INFO:``, ``WARNING:``, ``ERROR:``, glog's ``I1201``...), so the application decides
what is shown: the plugins set their ``*.native`` logger to ERROR unless the application
configured it (``eliza-backends -v`` shows INFO). Lines that carry no such prefix are not the
runtime's (another thread's output during the capture): they go back to stderr unchanged.

At exit, :func:`native_exit_to_logging` does the same for what the runtime frees then: the
objects a garbage collection still finds are freed inside a capture, and what C++ static
destructors print after Python is gone (LiteRT's ``DestroyAccelerator`` lines) goes nowhere
unless the logger shows INFO (``-v``), while Python's own ``sys.stderr`` keeps the terminal.

Process-wide, as fd 2 is: nested and concurrent captures share one redirection (the last to
leave replays it). Nothing is lost if the process dies mid-capture only in the sense that the
temporary file is gone; keep captures around loads and frees, not around generation.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import threading
from collections.abc import Iterator
from typing import IO

_PREFIX = re.compile(r"^(?:(VERBOSE|DEBUG|INFO|WARNING|ERROR|FATAL):|([IWEF])\d{4} )")
_LEVELS = {"VERBOSE": logging.DEBUG, "DEBUG": logging.DEBUG, "INFO": logging.INFO,
           "WARNING": logging.WARNING, "ERROR": logging.ERROR, "FATAL": logging.CRITICAL,
           "I": logging.INFO, "W": logging.WARNING, "E": logging.ERROR, "F": logging.CRITICAL}

_lock = threading.Lock()
_depth = 0
_saved_fd = -1
_capture: IO[bytes] | None = None
_target: logging.Logger | None = None  # the outermost capture's logger


def quiet_by_default(logger: logging.Logger) -> logging.Logger:
    """Set ``logger`` to ERROR unless the application gave it a level (returns it)."""
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.ERROR)
    return logger


@contextlib.contextmanager
def native_stderr_to_logging(logger: logging.Logger) -> Iterator[None]:
    """Capture fd 2 while the block runs; replay the runtime's lines to ``logger``."""
    global _depth, _saved_fd, _capture, _target
    with _lock:
        if _depth == 0:
            _target = logger
            with contextlib.suppress(ValueError, OSError):
                sys.stderr.flush()
            import tempfile  # (shutil, random, bz2, lzma: not at every plugin's discovery)

            try:
                capture = tempfile.TemporaryFile()  # noqa: SIM115 (closed by _release)
                saved = os.dup(2)
            except OSError:  # no fd to spare: leave stderr alone
                pass
            else:
                os.dup2(capture.fileno(), 2)
                _saved_fd, _capture = saved, capture
        _depth += 1
    try:
        yield
    finally:
        _release(logger)


def _release(logger: logging.Logger) -> None:
    global _depth, _saved_fd, _capture
    with _lock:
        _depth -= 1
        if _depth > 0 or _capture is None:
            return
        with contextlib.suppress(ValueError, OSError):
            sys.stderr.flush()
        os.dup2(_saved_fd, 2)
        os.close(_saved_fd)
        capture, _capture, _saved_fd = _capture, None, -1
        target = _target or logger
    capture.seek(0)
    data = capture.read()
    capture.close()
    replay(data.decode("utf-8", "replace"), target)


_exit_loggers: list[logging.Logger] = []


def native_exit_to_logging(logger: logging.Logger) -> None:
    """Route what the runtime prints while the process exits to ``logger`` (idempotent; call
    it when the runtime is first used). See the module docstring."""
    with _lock:
        if logger in _exit_loggers:
            return
        _exit_loggers.append(logger)
        if len(_exit_loggers) == 1:
            import atexit

            atexit.register(_at_exit)


def _at_exit() -> None:
    import gc

    loggers = list(_exit_loggers)
    with native_stderr_to_logging(loggers[0]):
        gc.collect()  # runtime objects in reference cycles: freed (and logged) here
    if any(lg.isEnabledFor(logging.INFO) for lg in loggers):
        return  # -v: the static destructors' lines are wanted, and fd 2 stays the terminal
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.flush()
        python_err = os.dup(2)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)
        sys.stderr = open(python_err, "w", buffering=1, encoding="utf-8",  # noqa: SIM115
                          errors="backslashreplace")


def replay(text: str, logger: logging.Logger) -> None:
    """Send captured native output to ``logger``: each line at its prefix's level, a line
    without one (a continuation such as ``└ ...``) at the level of the line before it; text
    before any prefixed line is not the runtime's and goes back to stderr."""
    level: int | None = None
    for line in text.splitlines():
        if not line.strip():
            continue
        match = _PREFIX.match(line)
        if match:
            level = _LEVELS[match.group(1) or match.group(2)]
        if level is None or (not match and not line.startswith(("└", " ", "\t"))):
            sys.stderr.write(line + "\n")
            level = None
            continue
        logger.log(level, "%s", line)


__all__ = ["native_exit_to_logging", "native_stderr_to_logging", "quiet_by_default", "replay"]
