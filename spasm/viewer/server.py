"""Serving the viewer with uvicorn: in the foreground (``spasm view``) or in a thread (tests,
benchmarks, notebooks)::

    with ViewerServer("runs/smoke") as server:
        print(server.url)          # http://127.0.0.1:PORT/
"""

from __future__ import annotations

import errno
import socket
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from spasm.errors import UserError
from spasm.viewer.security import is_loopback

if TYPE_CHECKING:
    from spasm.viewer.app import Extension

__all__ = ["ViewerServer", "bind"]


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (port 0: any free port), or a UserError that says
    what to do."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise UserError(f"Port {port} on {host} is in use; pass --port 0 for any free port.") from None
        raise UserError(f"Cannot listen on {host}:{port} ({exc.strerror}).") from None
    sock.listen(128)
    return sock


class ViewerServer:
    """The viewer app under uvicorn on its own socket; :meth:`start` in a thread or
    :meth:`run` in the foreground."""

    def __init__(self, run_dir: str | Path, *, host: str = "127.0.0.1", port: int = 0,
                 token: str | None = None, extend: Extension | None = None) -> None:
        import uvicorn

        from spasm.viewer.app import create_app

        self.host, self.token = host, token
        # The socket first: a port in use then fails before the index's temporary folder exists.
        self.sock = bind(host, port)
        try:
            self.app = create_app(run_dir, token=token, loopback=is_loopback(host), extend=extend)
        except BaseException:
            self.sock.close()
            raise
        self.port = int(self.sock.getsockname()[1])
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="on",
                                timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT`` (a wildcard bind is reached at 127.0.0.1)."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        host = f"[{host.strip('[]')}]" if ":" in host else host
        return f"http://{host}:{self.port}"

    @property
    def url(self) -> str:
        """The URL to open: the overview, with the token when there is one."""
        return self.base_url + "/" + (f"?token={self.token}" if self.token else "")

    def run(self) -> None:
        """Serve in the foreground until interrupted (Ctrl-C)."""
        try:
            self.server.run(sockets=[self.sock])
        finally:
            self._close()

    def start(self) -> ViewerServer:
        """Serve in a background thread; returns once requests are answered."""
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                        name="spasm-view", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the viewer did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        """Stop the thread started by :meth:`start` and release everything."""
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self._close()

    def _close(self) -> None:
        self.sock.close()
        self.app.state.viewer.close()

    def __enter__(self) -> ViewerServer:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
