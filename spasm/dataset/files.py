"""Crash-safe file writes, the only ones in spasm: write a temporary file beside the target,
fsync it, then ``os.replace`` it over the target.

A reader (or a resumed run) therefore sees either the old file or the complete new one, and a
failed write leaves no temporary file behind.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["atomic_write", "atomic_write_bytes", "atomic_write_json", "atomic_write_table",
           "atomic_write_text", "publish_mode"]


def publish_mode(fd: int) -> None:
    """Give a temporary file the mode a plain ``open()`` would have (mkstemp makes it 0600)."""
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp)`` on a temporary path beside ``path``, fsync it, move it into place.

    Parent directories are created. The temporary file is removed on every failure.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(name)
    try:
        publish_mode(fd)
        os.close(fd)
        write(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically."""
    def write(tmp: Path) -> None:
        tmp.write_bytes(data)

    return atomic_write(path, write)


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write UTF-8 ``text`` to ``path`` atomically."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, data: Any) -> Path:
    """Write ``data`` as indented, key-sorted JSON atomically."""
    return atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def atomic_write_table(path: str | Path, table: pa.Table) -> Path:
    """Write an Arrow table as one zstd-compressed Parquet file atomically."""
    return atomic_write(path, lambda tmp: pq.write_table(table, tmp, compression="zstd"))
