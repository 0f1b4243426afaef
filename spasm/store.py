"""The run directory and its Parquet tables (SPEC §7), with explicit, versioned schemas.

Layout of ``runs/<name>/``::

    config.json            the resolved run config (env var names only, never keys)
    manifest.json          versions, seed, counts, usage, timing, schema version
    personas.parquet/      one directory per table, each holding Parquet part files:
    dialogues.parquet/       pandas.read_parquet(run_dir / "dialogues.parquet") reads it
    turns.parquet/
    calls.parquet/
    errors.parquet/
    persona_rejections.parquet/
    cache.sqlite           the request cache (replays instead of paying on a rerun)
    .commits/              one empty marker per committed batch
    .tmp/                  parts being written (never inside a table directory)

Crash safety: a batch of completed dialogues is written part by part into ``.tmp/`` and moved
into place with ``os.replace`` (atomic), then its marker is created in ``.commits/``. On resume,
parts without a marker are deleted, so a batch is either wholly there or not at all. At the end
the parts of each table are compacted into one sorted part.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

SCHEMA_VERSION = "1.1"

_ts = pa.timestamp("us", tz="UTC")

SCHEMAS: dict[str, pa.Schema] = {
    "dialogues": pa.schema(
        [
            ("dialogue_id", pa.string()),
            ("persona_id", pa.string()),
            ("conversation_index", pa.int32()),
            ("condition", pa.string()),
            ("harness_level", pa.string()),
            ("pairing", pa.string()),
            ("client_backend", pa.string()),
            ("client_model", pa.string()),
            ("responder_backend", pa.string()),
            ("responder_model", pa.string()),
            ("seed", pa.int64()),
            ("responder_role", pa.string()),
            ("client_system_prompt", pa.string()),
            ("responder_system_prompt", pa.string()),
            ("n_utterances", pa.int32()),
            ("termination_reason", pa.string()),
            ("termination_detail", pa.string()),
            ("prompt_tokens", pa.int64()),
            ("completion_tokens", pa.int64()),
            ("n_calls", pa.int32()),
            ("status", pa.string()),
        ]
    ),
    "turns": pa.schema(
        [
            ("dialogue_id", pa.string()),
            ("turn_index", pa.int32()),
            ("speaker", pa.string()),
            ("text", pa.string()),
            ("n_tokens", pa.int32()),
            ("prompt_tokens", pa.int32()),
            ("latency_s", pa.float64()),
            ("attempts", pa.int32()),
            ("checker_verdict", pa.string()),
            ("flagged", pa.bool_()),
            ("messages_sha256", pa.string()),
            # The Persona Harness (SPEC §4); empty at level A unless noted.
            ("flag_reason", pa.string()),  # failed_twice | checker_unavailable
            ("intent", pa.string()),  # small_talk | venting | advice_seeking | task
            ("state", pa.string()),  # the speaker's state after this turn (JSON; level C+)
            ("state_clips", pa.int32()),  # values the reducer's hard constraints clipped
            ("state_log", pa.string()),  # JSON: clips, decays, fallback
            ("harness_fallbacks", pa.int32()),  # harness calls that fell back this turn
            ("cached_prompt_tokens", pa.int64()),  # estimate: prompt tokens a prefix cache serves
            ("messages", pa.string()),  # JSON: the exact messages seen (level B+)
            ("probe", pa.string()),  # JSON: recall probe, on each speaker's last turn
        ]
    ),
    "calls": pa.schema(
        [
            ("call_id", pa.string()),
            ("dialogue_id", pa.string()),
            ("persona_id", pa.string()),
            ("role", pa.string()),
            ("backend", pa.string()),
            ("model", pa.string()),
            ("resolved_model", pa.string()),
            ("request_hash", pa.string()),
            ("params", pa.string()),
            ("attempt", pa.int32()),
            ("prompt_tokens", pa.int64()),
            ("completion_tokens", pa.int64()),
            ("latency_s", pa.float64()),
            ("cache_hit", pa.bool_()),
            ("outcome", pa.string()),
            ("error", pa.string()),
            ("started_at", _ts),
        ]
    ),
    "errors": pa.schema(
        [
            ("dialogue_id", pa.string()),
            ("persona_id", pa.string()),
            ("condition", pa.string()),
            ("pairing", pa.string()),
            ("error_type", pa.string()),
            ("error", pa.string()),
            ("n_utterances", pa.int32()),
            ("partial_transcript", pa.string()),
            ("failed_at", _ts),
        ]
    ),
}

#: Sort and de-duplication keys used when compacting.
KEYS: dict[str, list[str]] = {
    "dialogues": ["dialogue_id"],
    "turns": ["dialogue_id", "turn_index"],
    "calls": ["call_id"],
    "errors": ["dialogue_id", "failed_at"],
    "personas": ["persona_index"],
    "persona_rejections": ["draw"],
}


def persona_schema(field_names: Iterable[str], integer_fields: set[str]) -> pa.Schema:
    """The personas table: fixed columns plus one column per persona-schema field."""
    cols = [("persona_id", pa.string()), ("persona_index", pa.int32()), ("seed", pa.int64())]
    cols += [(f, pa.int64() if f in integer_fields else pa.string()) for f in field_names]
    cols += [
        ("card", pa.string()),
        ("card_source", pa.string()),
        ("verdicts", pa.string()),
        ("schema_name", pa.string()),
        ("schema_version", pa.string()),
        # The CharacterPolicy compiled from the card (JSON) and its version (SPEC §4.1).
        ("policy", pa.string()),
        ("policy_version", pa.string()),
    ]
    return pa.schema(cols)


def rejection_schema(field_names: Iterable[str], integer_fields: set[str]) -> pa.Schema:
    """Rejected persona candidates with the stage and reasons."""
    cols = [("draw", pa.int64())]
    cols += [(f, pa.int64() if f in integer_fields else pa.string()) for f in field_names]
    cols += [("stage", pa.string()), ("reasons", pa.string())]
    return pa.schema(cols)


def atomic_write_text(path: Path, text: str) -> None:
    """Write a text file so readers see the old or the new content, never half of it."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def _dedupe_sorted(table: pa.Table, keys: list[str]) -> pa.Table:
    """Drop rows whose keys equal the previous row's (the table is sorted by ``keys``).

    Pure Arrow, so compaction holds the table once rather than once more as pandas.
    """
    if table.num_rows < 2:
        return table
    changed = None
    for k in keys:
        col = table.column(k)
        diff = pc.fill_null(pc.not_equal(col.slice(1), col.slice(0, table.num_rows - 1)), True)
        changed = diff if changed is None else pc.or_(changed, diff)
    assert changed is not None
    mask = pa.concat_arrays([pa.array([True]), *changed.chunks])
    return table.filter(mask)


class RunStore:
    """Writes and reads the tables of one run directory."""

    def __init__(self, run_dir: Path) -> None:
        self.dir = run_dir
        self.tmp = run_dir / ".tmp"
        self.commits = run_dir / ".commits"
        self.schemas = dict(SCHEMAS)

    def create(self) -> None:
        for d in (self.dir, self.tmp, self.commits):
            d.mkdir(parents=True, exist_ok=True)

    def table_dir(self, table: str) -> Path:
        return self.dir / f"{table}.parquet"

    # -- writing --------------------------------------------------------------------------
    def _write_part(
        self, table: str, rows: list[dict[str, Any]], name: str, allow_empty: bool = False
    ) -> Path | None:
        if not rows and not allow_empty:
            return None
        schema = self.schemas[table]
        data = pa.Table.from_pylist([{k: r.get(k) for k in schema.names} for r in rows], schema)
        tmp = self.tmp / f"{table}-{name}"
        pq.write_table(data, tmp, compression="zstd")
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        target_dir = self.table_dir(table)
        target_dir.mkdir(exist_ok=True)
        target = target_dir / name
        os.replace(tmp, target)
        return target

    def write_batch(
        self, batch_id: str, tables: dict[str, list[dict[str, Any]]], allow_empty: bool = False
    ) -> None:
        """Write one batch to every table it has rows for, then commit it with a marker."""
        name = f"part-{batch_id}.parquet"
        for table, rows in tables.items():
            self._write_part(table, rows, name, allow_empty)
        marker = self.commits / batch_id
        marker.touch()

    # -- recovery ---------------------------------------------------------------------------
    def recover(self) -> int:
        """Delete parts of uncommitted batches and leftovers; finish an interrupted compaction.

        Returns the number of files removed.
        """
        removed = 0
        journal = self.dir / ".compaction.json"
        if journal.exists():
            job = json.loads(journal.read_text())
            if Path(job["result"]).exists():
                for p in job["replaces"]:
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(p)
                        removed += 1
            journal.unlink()
        for tmp in self.tmp.glob("*"):
            tmp.unlink()
            removed += 1
        committed = {p.name for p in self.commits.glob("*")}
        for table_dir in self.dir.glob("*.parquet"):
            for part in table_dir.glob("part-*.parquet"):
                batch = part.name[len("part-") : -len(".parquet")]
                if batch not in committed and not batch.startswith("compacted"):
                    part.unlink()
                    removed += 1
        return removed

    # -- reading ----------------------------------------------------------------------------
    def parts(self, table: str) -> list[Path]:
        d = self.table_dir(table)
        return sorted(d.glob("part-*.parquet")) if d.exists() else []

    def read(self, table: str, columns: list[str] | None = None) -> pa.Table | None:
        """Read a table (all committed parts), or ``None`` if it has none."""
        parts = self.parts(table)
        if not parts:
            return None
        tables = [pq.read_table(p, columns=columns) for p in parts]
        return pa.concat_tables(tables, promote_options="default")

    def done_dialogue_ids(self) -> set[str]:
        t = self.read("dialogues", columns=["dialogue_id"])
        return set(t.column("dialogue_id").to_pylist()) if t is not None else set()

    # -- compaction -------------------------------------------------------------------------
    def compact(self, table: str) -> None:
        """Merge a table's parts into one part, de-duplicated by key and sorted."""
        parts = self.parts(table)
        if not parts or (len(parts) == 1 and parts[0].name.startswith("part-compacted")):
            return  # nothing to merge, and already sorted
        data = self.read(table)
        assert data is not None
        keys = [k for k in KEYS.get(table, []) if k in data.column_names]
        if keys:
            data = _dedupe_sorted(data.sort_by([(k, "ascending") for k in keys]), keys)
        name = f"part-compacted-{uuid.uuid4().hex[:8]}.parquet"
        tmp = self.tmp / name
        pq.write_table(data, tmp, compression="zstd")
        result = self.table_dir(table) / name
        write_json(self.dir / ".compaction.json",
                   {"result": str(result), "replaces": [str(p) for p in parts]})
        os.replace(tmp, result)
        for p in parts:
            with contextlib.suppress(FileNotFoundError):
                os.remove(p)
        (self.dir / ".compaction.json").unlink()

    def ensure_tables(self, tables: Iterable[str]) -> None:
        """Give every named table at least an empty, typed part, so readers always find it."""
        missing = [t for t in tables if not self.parts(t) and t in self.schemas]
        if missing:
            self.write_batch("empty", {t: [] for t in missing}, allow_empty=True)

    def compact_all(self) -> None:
        for d in sorted(self.dir.glob("*.parquet")):
            self.compact(d.name[: -len(".parquet")])
