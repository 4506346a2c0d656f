"""A local Ray cluster for the tests of ``eliza_backends.ray``: 2 CPUs, no dashboard, a small
object store, loopback only. Ray gives its raylet a fixed 30 s to register; on a machine
overloaded by other jobs that can pass, so a start that timed out is tried again (twice)."""

from __future__ import annotations

import socket

import ray


def free_port() -> int:
    """A TCP port free on loopback now (for Serve's HTTP proxy)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_local_ray(num_cpus: int = 2, attempts: int = 3) -> None:
    """``ray.init`` a new local cluster (never an existing one)."""
    for attempt in range(attempts):
        try:
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False,
                     log_to_driver=False, object_store_memory=100 << 20)
            return
        except Exception as exc:
            if "timed out during startup" not in str(exc) or attempt == attempts - 1:
                raise
            ray.shutdown()
