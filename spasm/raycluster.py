"""Ray, the optional extra behind ``spasm generate --executor ray`` and ``spasm eval --ray``:
importing it with the install hint, checking a cluster address before Ray retries it for
minutes, and connecting to (or starting) a cluster for one command.

Ray is imported only inside these functions; nothing here runs without the extra.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from spasm.errors import UserError

__all__ = ["CONNECT_TIMEOUT_S", "INSTALL_HINT", "check_address", "import_ray", "ray_session"]

INSTALL_HINT = ("Ray is an optional extra (for --executor ray and spasm eval --ray): pip install "
                "'spasm[ray]' (or pip install 'ray[default]>=2.9'), then run the same command again.")

#: Seconds to wait for a TCP answer from the cluster's address before refusing it.
CONNECT_TIMEOUT_S = 5.0


def import_ray() -> Any:
    """The ``ray`` module, or a :class:`UserError` saying how to install it."""
    try:
        import ray
    except ImportError:
        raise UserError(INSTALL_HINT) from None
    return ray


def check_address(address: str | None, flag: str = "--ray-address") -> None:
    """Refuse at once (:class:`UserError`, exit 2) a cluster address where nothing listens.

    Ray itself retries an unreachable address for minutes before it gives up, so the
    ``host:port`` of ``flag`` (else ``RAY_ADDRESS``) gets one TCP connection first.
    ``auto``, ``local`` and no address at all are left to Ray (they start or find a local one).
    """
    flag = flag if address else "RAY_ADDRESS"
    addr = (address or os.environ.get("RAY_ADDRESS") or "").strip()
    if not addr or addr in ("auto", "local"):
        return
    target = addr.split("://", 1)[1] if "://" in addr else addr
    host, sep, port = target.rstrip("/").rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"{flag} {addr!r} is not a cluster address: give HOST:PORT of the head "
                        "node (e.g. 10.0.0.5:6379, or ray://10.0.0.5:10001), or auto.")
    host = host.strip("[]") or "127.0.0.1"
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise UserError(
            f"{flag} {addr}: no Ray cluster answers at {host}:{port} ({reason}). Start one "
            f"there (ray start --head) or fix the address; without an address a local Ray is "
            "started."
        ) from None


@contextmanager
def ray_session(address: str | None, flag: str = "--ray") -> Iterator[Any]:
    """Ray connected for one command: to ``address`` (else ``RAY_ADDRESS``), to a Ray already
    initialised in this process (left running), else a local one started and shut down here."""
    ray = import_ray()
    if ray.is_initialized():
        yield ray
        return
    check_address(address, flag)
    local = address is None and not os.environ.get("RAY_ADDRESS")
    handler = signal.getsignal(signal.SIGTERM)
    ray.init(address=address, **({"include_dashboard": False} if local else {}), log_to_driver=False)
    if handler is not None and threading.current_thread() is threading.main_thread():
        # ray.init replaces it with sys.exit: put spasm's back, so SIGTERM stops as without Ray.
        signal.signal(signal.SIGTERM, handler)
    try:
        yield ray
    finally:
        ray.shutdown()
