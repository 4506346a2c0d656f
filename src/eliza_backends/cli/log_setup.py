"""``-v`` / ``-q``: the command line's logging, the runtimes' native loggers included.

One stderr handler for every logger. The runtimes' native output (llama.cpp's log callback,
LiteRT's captured stderr) goes to loggers that each plugin declares on its factory
(``Factory.native_loggers``), so a third-party plugin's are configured like the first-party
ones: the CLI asks the registry for the factories it already builds (which imports the plugin
modules, never a runtime).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..registry import Registry


def native_logger_names(registry: Registry | None = None) -> list[str]:
    """The loggers the installed backends declare for their runtime's native output, sorted
    and without repeats (``registry``: the process-wide one by default)."""
    from ..registry import default_registry

    factories = (registry or default_registry()).factories()
    return sorted({name for factory in factories for name in factory.native_loggers})


def configure_logging(verbose: int, quiet: bool, registry: Registry | None = None, *,
                      native: bool = True) -> None:
    """One stderr handler for every logger: default warnings, ``-v`` info, ``-vv`` debug,
    ``-q`` errors. The native loggers the backends of ``registry`` declare show errors only,
    unless ``-v`` or ``-vv`` asks for more (then they follow the same level). ``native=False``
    (a command that loads no runtime) leaves them alone, and so skips the plugin discovery
    that finds them (a third of a second)."""
    import logging

    if quiet:
        level = logging.ERROR
    else:
        level = {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)
    logging.basicConfig(level=level, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    if not native:
        return
    native_level = logging.ERROR if verbose == 0 or quiet else level
    for name in native_logger_names(registry):
        logging.getLogger(name).setLevel(native_level)


__all__ = ["configure_logging", "native_logger_names"]
