"""The run lock: one writer per run directory (an OS file lock, released when the process dies).

Two processes writing one run directory (a second terminal, a scheduler retry) would
interleave batches and pay twice for the same calls. Every command that writes a run directory
holds :class:`RunLock` on ``RUN_DIR/.lock`` for as long as it writes; a second writer fails at
once with a :class:`~spasm.errors.UserError` naming the PID that holds it. The lock is
``fcntl.flock``: the kernel drops it when the holder exits, even on ``kill -9``, so a stale
lock file never blocks a rerun.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

from spasm.errors import UserError

__all__ = ["LOCK_FILE", "RunLock", "lock_holder", "waiting_lock"]

LOCK_FILE = ".lock"


def _read_pid(path: Path) -> int | None:
    try:
        text = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None


def lock_holder(run_dir: Path) -> int | None:
    """The PID of the process writing ``run_dir`` now, or ``None`` if nobody holds the lock."""
    path = Path(run_dir) / LOCK_FILE
    if not path.exists():
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _read_pid(path) or -1
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


class RunLock:
    """Hold the write lock of a run directory (a context manager; also ``acquire``/``release``)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        """Take the lock or raise :class:`UserError` naming the process that holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            pid = _read_pid(self.path)
            who = f"process {pid}" if pid else "another process"
            raise UserError(
                f"{self.path.parent} is being written by {who} (it holds {self.path}). Wait for "
                "it to finish, stop it, or use another --out."
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


@contextmanager
def waiting_lock(path: Path) -> Iterator[bool]:
    """Hold an exclusive lock on ``path`` (created if missing), waiting for a holder to finish:
    for work two processes must not do at once but the second may then reuse (a cache entry
    built once). Yields whether the lock is held: ``False`` when the file cannot be created
    (a read-only cache folder), and the work goes on unlocked."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield False
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield True
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
