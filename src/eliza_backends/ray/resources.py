"""How many compute threads a model gets on a Ray worker: the CPUs Ray reserved for it.

Ray starts each actor with ``num_cpus`` reserved, but a runtime left to its default would
start one thread per core of the whole node, and several actors on one node would then
oversubscribe it. :func:`worker_config` gives a config without ``threads`` the actor's
reservation (divided among its sessions, or shared by sessions batched in one runtime
context: :func:`reserved_cores` is the budget the server pool and the batch lanes divide)
instead.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from ..config import StreamConfig


def reserved_cpus() -> float | None:
    """The CPUs Ray reserved for the current actor or task; None outside a Ray worker (or
    when nothing was reserved)."""
    ray = sys.modules.get("ray")  # a Ray worker has imported it; never import it here
    if ray is None or not ray.is_initialized():
        return None
    try:
        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
    except AssertionError:  # Ray's answer in the driver: nothing is reserved for it
        return None
    return float(cpus) if cpus else None


def reserved_cores() -> int | None:
    """:func:`reserved_cpus` as a whole number of cores (at least 1); None outside a Ray
    worker. The CPU budget a pool or lanes divide their threads from."""
    cpus = reserved_cpus()
    return None if cpus is None else max(1, int(cpus))


def worker_config(config: StreamConfig | Mapping[str, Any] | None, sessions: int = 1
                  ) -> StreamConfig:
    """``config`` as a :class:`StreamConfig`; when it does not say ``threads`` and this runs
    on a Ray worker with CPUs reserved, ``threads`` is that reservation divided among
    ``sessions`` (at least 1)."""
    base = StreamConfig.build(config)
    cpus = reserved_cpus()
    if base.threads is None and cpus is not None:
        base = StreamConfig.build(base, threads=max(1, int(cpus) // sessions))
    return base


__all__ = ["reserved_cores", "reserved_cpus", "worker_config"]
