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

__all__ = ["Damage", "covered_batches", "file_sha256", "find_damage", "part_record"]


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


def covered_batches(run_dir: Path, table: str, replaces: list[Path]) -> list[str]:
    """The commits a new compacted part of ``table`` supersedes once it replaces ``replaces``:
    those of the parts it replaces, and those an earlier compacted part it replaces had
    superseded. Recorded in its marker (``"supersedes"``), so that :func:`find_damage` can
    excuse their missing parts from the markers' contents alone, never from file times."""
    commits = Path(run_dir) / ".commits"
    out: set[str] = set()
    legacy = False
    for p in replaces:
        batch = p.name[len("part-") : -len(".parquet")]
        out.add(batch)  # a compacted part's marker too: a crash may leave it behind
        if not batch.startswith("compacted"):
            continue
        data = _marker(commits / batch) if (commits / batch).exists() else None
        listed = data.get("supersedes") if data else None
        if isinstance(listed, list):
            out.update(str(b) for b in listed)
        else:
            legacy = True  # an older compacted part: its marker does not say what it merged
    if legacy and commits.is_dir():
        # What an older compacted part merged: every batch whose part of the table is gone.
        for marker in commits.iterdir():
            data = _marker(marker)
            entry = ((data or {}).get("parts") or {}).get(table)
            if isinstance(entry, dict) and not marker.name.startswith("compacted") and not (
                    Path(run_dir) / f"{table}.parquet" / str(entry.get("file"))).exists():
                out.add(marker.name)
    return sorted(out)


def find_damage(run_dir: Path) -> list[Damage]:
    """Every committed part whose rows or checksum differ from its marker, or that is missing.

    Content only, never file times (a copy or a restore need not keep them): a batch part
    missing because compaction merged it (or a table's replacement superseded it) is not
    damage when a compacted part of its table lists the batch in its marker's ``supersedes``.
    A compacted part written before markers had that list excuses every missing batch part of
    its table (it cannot say which it merged).
    """
    commits = run_dir / ".commits"
    if not commits.is_dir():
        return []
    damage: list[Damage] = []
    markers = {m.name: _marker(m) for m in sorted(commits.iterdir())}
    superseded: dict[str, set[str]] = {}
    legacy: set[str] = set()  # tables with a compacted part whose marker lists nothing
    for name, data in markers.items():
        if not name.startswith("compacted") or not data or data.get("damaged"):
            continue
        listed = data.get("supersedes")
        for table in data.get("parts") or {}:
            if isinstance(listed, list):
                superseded.setdefault(table, set()).update(str(b) for b in listed)
            else:
                legacy.add(table)
    for name, data in markers.items():
        marker = commits / name
        if data is None:
            continue
        if data.get("damaged"):
            damage.append(Damage(name, "", marker, "commit marker is not readable"))
            continue
        for table, expected in (data.get("parts") or {}).items():
            path = run_dir / f"{table}.parquet" / str(expected.get("file"))
            if not path.exists() and (name in superseded.get(table, ()) or table in legacy):
                continue  # merged into (or replaced by) a compacted part
            problem = _check(path, expected)
            if problem is not None:
                damage.append(Damage(name, table, path, problem))
    return damage
