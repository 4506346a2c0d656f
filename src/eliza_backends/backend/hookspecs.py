"""The one extension point: how a plugin distribution hands its backends to eliza-backends.

A plugin is a module (or any object) registered under the ``eliza_backends`` entry-point group
that implements :func:`eliza_backends_factories` with the :data:`hookimpl` marker::

    # pyproject.toml
    [project.entry-points.eliza_backends]
    mybackend = "my_backend_plugin"

    # my_backend_plugin/__init__.py
    from eliza_backends import hookimpl

    @hookimpl
    def eliza_backends_factories():
        return [MyFactory()]

Keep the plugin module light: import the heavy runtime inside ``Factory.open()``, never at
module import, ``available()`` or ``can_serve()`` time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from .factory import Factory

PROJECT_NAME = "eliza_backends"
#: The entry-point group plugins register under (also the pluggy project name).
ENTRY_POINT_GROUP = "eliza_backends"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
#: Marker for plugin hook implementations.
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def eliza_backends_factories() -> Sequence[Factory]:  # type: ignore[empty-body]
    """Return the backend factories this plugin provides.

    Called once per process, lazily, the first time backends are listed or selected. Return a
    list of :class:`~eliza_backends.Factory` instances (usually one). Construction must be
    cheap: no model load, no import of the runtime. Anything else returned, or an exception
    raised here, is reported as a broken plugin without affecting the other plugins.
    """
