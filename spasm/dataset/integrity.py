"""Integrity of committed parts: each commit marker records its parts' row counts and sha256.

A batch's marker (``.commits/<batch>``) is JSON ``{"parts": {"<table>": {"file": ..., "rows":
n, "sha256": ...}}}``; a compacted part has its own marker ``.commits/compacted-<id>``. Markers
of runs written before schema 1.2 are empty files: their parts are accepted unverified.
:func:`find_damage` compares what is on disk with what was committed; the engine redoes the
dialogues of a damaged batch on start-up and readers refuse a damaged run.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

__all__ = ["Damage", "file_sha256", "find_damage", "part_record"]


@dataclass(frozen=True)
class Damage:
    """One committed part that is not what was committed."""

    batch: str
    table: str
    path: Path
    problem: str

    def __str__(self) -> str:
        return f"{self.path.parent.name}/{self.path.name}: {self.problem}"


def file_sha256(path: Path) -> str:
    """sha256 of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def part_record(path: Path, rows: int) -> dict[str, Any]:
    """What a marker records of one written part."""
    return {"file": path.name, "rows": rows, "sha256": file_sha256(path)}


def _marker(path: Path) -> dict[str, Any] | None:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return {"damaged": True}
    if not text:
        return None  # a marker from before schema 1.2: nothing to check against
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return {"damaged": True}
    return data if isinstance(data, dict) else {"damaged": True}


def _check(path: Path, expected: dict[str, Any]) -> str | None:
    if not path.exists():
        return "missing"
    if file_sha256(path) != expected.get("sha256"):
        return "contents differ from what was committed (checksum mismatch)"
    try:
        rows = pq.ParquetFile(path).metadata.num_rows
    except Exception as exc:  # pyarrow raises many unrelated types for a bad file
        return f"not readable as Parquet ({type(exc).__name__})"
    if rows != expected.get("rows"):
        return f"{rows} rows, {expected.get('rows')} committed"
    return None


def find_damage(run_dir: Path) -> list[Damage]:
    """Every committed part whose rows or checksum differ from its marker, or that is missing.

    A batch part missing because compaction merged it is not damage: its table then has a
    compacted part.
    """
    commits = run_dir / ".commits"
    if not commits.is_dir():
        return []
    damage: list[Damage] = []
    compacted: dict[str, float] = {}
    for p in run_dir.glob("*.parquet/part-compacted-*.parquet"):
        table = p.parent.name[: -len(".parquet")]
        compacted[table] = max(compacted.get(table, 0.0), p.stat().st_mtime)
    for marker in sorted(commits.iterdir()):
        data = _marker(marker)
        if data is None:
            continue
        if data.get("damaged"):
            damage.append(Damage(marker.name, "", marker, "commit marker is not readable"))
            continue
        for table, expected in (data.get("parts") or {}).items():
            path = run_dir / f"{table}.parquet" / str(expected.get("file"))
            if not path.exists() and compacted.get(table, 0.0) >= marker.stat().st_mtime:
                continue  # merged into a later compacted part
            problem = _check(path, expected)
            if problem is not None:
                damage.append(Damage(marker.name, table, path, problem))
    return damage
