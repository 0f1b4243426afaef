"""Merging sorted Parquet parts with bounded memory: the end-of-run compaction and ``spasm merge``.

Every part the store writes is sorted by its table's keys (and says so in its Parquet
metadata, ``sorting_columns``), so a table is compacted — and shards are merged — by a k-way
merge of sorted parts instead of reading the whole table into memory and sorting it:

* each source is read in record batches small enough that all sources' current batches fit
  in :data:`MEMORY_BUDGET`;
* each step takes the smallest of the sources' last keys (the *frontier*): every row at or
  below it, in every source, can be written now, because each source is sorted. Those rows
  are one small table, sorted with Arrow (stable, so equal keys keep their source order) and
  de-duplicated; the source whose batch ended at the frontier moves on to its next batch;
* more than :data:`FAN_IN` sources are merged in passes through temporary files, as an
  external sort does, so the number of open batches stays fixed however many parts a run has.

Memory therefore depends on the budget, the fan-in and the page size (a Parquet reader holds
one decoded page per column: merged parts are written with small pages and row groups, and read
on one thread), not on the table: ``benchmarks/merge_memory.py`` measures it. A part without the
sorted metadata (written by an older spasm, or by another tool) is checked by streaming its
keys and, when it is not sorted, sorted on its own first (such parts are one batch of a run).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

__all__ = ["FAN_IN", "MEMORY_BUDGET", "dedupe_sorted", "merge_sorted", "sort_rows", "sorting_columns"]

#: Bytes of decoded rows the sources' batches of one merge hold at once (the step being sorted
#: is at most as much again).
MEMORY_BUDGET = 8 << 20
#: Decoded bytes of one row group of a merged part: the output buffer, and what a later reader
#: of the part holds per column chunk.
ROW_GROUP_BYTES = 4 << 20
#: Parquet data pages of merged parts: a reader decodes a page per column at a time.
_PAGE_BYTES = 256 << 10
#: Parquet reads in blocks of this size, so a source's whole column chunk is never in memory.
_READ_BUFFER = 1 << 20
#: Sources merged in one pass; more go through intermediate files.
FAN_IN = 16
_MIN_ROWS, _MAX_ROWS = 64, 65_536

Key = tuple[tuple[Any, ...], ...]


def _sort_keys(keys: Sequence[str]) -> list[tuple[str, str]]:
    return [(k, "ascending") for k in keys]


def sorting_columns(schema: pa.Schema, keys: Sequence[str]) -> tuple[pq.SortingColumn, ...] | None:
    """The Parquet ``sorting_columns`` metadata of a part sorted by ``keys`` (nulls last)."""
    if not keys:
        return None
    columns: tuple[pq.SortingColumn, ...] = pq.SortingColumn.from_ordering(
        schema, _sort_keys(keys), null_placement="at_end")
    return columns


def sort_rows(data: pa.Table, keys: Sequence[str]) -> pa.Table:
    """``data`` sorted by ``keys`` (stable; nulls last), as every written part is."""
    return data.sort_by(_sort_keys(keys)) if keys and data.num_rows > 1 else data


def dedupe_sorted(table: pa.Table, keys: Sequence[str]) -> pa.Table:
    """Drop rows whose keys equal the previous row's (``table`` is sorted by ``keys``); the
    first of equal rows is kept. Rows with a null key are never dropped."""
    if table.num_rows < 2 or not keys:
        return table
    changed = None
    for k in keys:
        col = table.column(k)
        diff = pc.fill_null(pc.not_equal(col.slice(1), col.slice(0, table.num_rows - 1)), True)
        changed = diff if changed is None else pc.or_(changed, diff)
    assert changed is not None
    mask = pa.concat_arrays([pa.array([True]), *changed.chunks])
    return table.filter(mask)


def _key_at(columns: Sequence[pa.Array | pa.ChunkedArray], i: int) -> Key:
    # (1,) sorts after every (0, value): nulls last, as Arrow sorts them.
    return tuple((0, v) if (v := c[i].as_py()) is not None else (1,) for c in columns)


def _conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` with exactly ``schema``'s columns (a column an older part lacks is null)."""
    if batch.schema.equals(schema, check_metadata=False):
        return batch
    arrays = []
    for field in schema:
        i = batch.schema.get_field_index(field.name)
        if i < 0:
            arrays.append(pa.nulls(batch.num_rows, field.type))
        else:
            col = batch.column(i)
            arrays.append(col if col.type == field.type else col.cast(field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _declares_sorted(md: pq.FileMetaData, schema: pa.Schema, keys: Sequence[str]) -> bool:
    if md.num_row_groups == 0:
        return True
    if not keys or any(k not in schema.names for k in keys):
        return False
    want = sorting_columns(schema, keys)
    return all(md.row_group(i).sorting_columns == want for i in range(md.num_row_groups))


def _is_sorted(path: Path, keys: Sequence[str]) -> bool:
    """Whether a part that does not say so in its metadata is sorted by ``keys`` (streamed)."""
    pf = pq.ParquetFile(path, buffer_size=_READ_BUFFER)
    if any(k not in pf.schema_arrow.names for k in keys):
        return False
    previous: Key | None = None
    for batch in pf.iter_batches(batch_size=_MAX_ROWS, columns=list(keys)):
        n = batch.num_rows
        if n == 0:
            continue
        order = pc.sort_indices(batch, sort_keys=_sort_keys(keys))  # nulls last
        if not np.array_equal(order.to_numpy(), np.arange(n)):
            return False
        columns = batch.columns
        if previous is not None and _key_at(columns, 0) < previous:
            return False
        previous = _key_at(columns, n - 1)
    return True


def _row_bytes(sources: Sequence[Path]) -> float:
    """Decoded bytes per row, measured on a small first batch of the largest few sources."""
    widest = 64.0
    for path in sorted(sources, key=lambda p: p.stat().st_size, reverse=True)[:4]:
        for batch in pq.ParquetFile(path, buffer_size=_READ_BUFFER).iter_batches(batch_size=256):
            if batch.num_rows:
                widest = max(widest, batch.nbytes / batch.num_rows)
            break
    return widest


@dataclass(frozen=True)
class _Merge:
    """What every group of one merge shares."""

    schema: pa.Schema
    keys: list[str]
    dedupe: bool
    budget: int
    #: Decoded bytes per row (estimated once per merge).
    width: float


class _Cursor:
    """One sorted source being read batch by batch.

    A batch is extended with the next while that starts with the key the batch ends with, so
    a batch's last key has no more rows in the source: each merge step then takes every row
    of that key from every source at once, in source order.
    """

    def __init__(self, path: Path, schema: pa.Schema, keys: Sequence[str], rows: int) -> None:
        self._batches: Iterator[pa.RecordBatch] = pq.ParquetFile(
            path, buffer_size=_READ_BUFFER).iter_batches(batch_size=rows, use_threads=False)
        self._schema = schema
        self._key_names = list(keys)
        self._next: pa.Table | None = self._read()
        self.batch: pa.Table | None = None
        self.advance()

    def _read(self) -> pa.Table | None:
        for batch in self._batches:
            if batch.num_rows:
                return pa.Table.from_batches([_conform(batch, self._schema)])
        return None

    def _key(self, table: pa.Table, i: int) -> Key:
        return _key_at([table.column(k) for k in self._key_names], i)

    def advance(self) -> None:
        batch, self._next = self._next, None
        if batch is not None and self._key_names:
            while (following := self._read()) is not None:
                if self._key(following, 0) != self._key(batch, batch.num_rows - 1):
                    self._next = following
                    break
                batch = pa.concat_tables([batch, following])
        elif batch is not None:
            self._next = self._read()
        self.batch = batch

    def last_key(self) -> Key:
        assert self.batch is not None
        return self._key(self.batch, self.batch.num_rows - 1)

    def take_through(self, frontier: Key) -> pa.Table | None:
        """Remove and return the leading rows whose key is at most ``frontier``."""
        assert self.batch is not None
        columns = [self.batch.column(k) for k in self._key_names]
        lo, hi = 0, self.batch.num_rows
        while lo < hi:  # the first row above the frontier (the batch is sorted)
            mid = (lo + hi) // 2
            if _key_at(columns, mid) <= frontier:
                lo = mid + 1
            else:
                hi = mid
        if lo == 0:
            return None
        head = self.batch.slice(0, lo)
        if lo == self.batch.num_rows:
            self.advance()
        else:
            self.batch = self.batch.slice(lo)
        return head


class _Writer:
    """Buffers sorted rows into row groups of a target size; drops keys already written."""

    def __init__(self, dest: Path, schema: pa.Schema, keys: Sequence[str], dedupe: bool,
                 group_rows: int, page_bytes: int) -> None:
        self._writer = pq.ParquetWriter(dest, schema, compression="zstd", data_page_size=page_bytes,
                                        sorting_columns=sorting_columns(schema, keys))
        self._keys, self._dedupe, self._group_rows = list(keys), dedupe, group_rows
        self._buffer: list[pa.Table] = []
        self._buffered = 0
        self._last: Key | None = None
        self.rows = 0

    def add(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        if self._dedupe and self._keys:
            table = dedupe_sorted(table, self._keys)
            columns = [table.column(k) for k in self._keys]
            first = _key_at(columns, 0)
            if first == self._last and all(part != (1,) for part in first):
                table = table.slice(1)  # the same key ended the previous step
            if table.num_rows == 0:
                return
        if self._keys:
            self._last = _key_at([table.column(k) for k in self._keys], table.num_rows - 1)
        self._buffer.append(table)
        self._buffered += table.num_rows
        if self._buffered >= self._group_rows:
            self._flush()

    def _flush(self) -> None:
        if self._buffer:
            data = pa.concat_tables(self._buffer)
            self._writer.write_table(data, row_group_size=self._group_rows)
            self.rows += data.num_rows
            self._buffer, self._buffered = [], 0
            # Hand freed buffers back to the OS now and then (mimalloc keeps them otherwise).
            pa.default_memory_pool().release_unused()

    def close(self) -> None:
        self._flush()
        self._writer.close()


def _merge_group(sources: Sequence[Path], dest: Path, m: _Merge, *, final: bool) -> int:
    schema, keys = m.schema, m.keys
    # Each source holds its batch and the next one read ahead.
    rows = int(min(_MAX_ROWS, max(_MIN_ROWS, m.budget // (2 * len(sources) * m.width))))
    group_rows = int(min(4 * _MAX_ROWS, max(1024, ROW_GROUP_BYTES // m.width)))
    # A reader decodes one page per column at a time: an intermediate file, read by a group
    # of FAN_IN, gets small pages.
    page_bytes = _PAGE_BYTES if final else _PAGE_BYTES // 4
    writer = _Writer(dest, schema, keys, m.dedupe, group_rows, page_bytes)
    try:
        if not keys:  # nothing to order by: the sources one after the other
            for path in sources:
                cursor = _Cursor(path, schema, keys, rows)
                while cursor.batch is not None:
                    writer.add(cursor.batch)
                    cursor.advance()
            return writer.rows
        cursors = [_Cursor(path, schema, keys, rows) for path in sources]
        while True:
            live = [c for c in cursors if c.batch is not None]
            if not live:
                break
            if len(live) == 1:
                assert live[0].batch is not None
                writer.add(live[0].batch)
                live[0].advance()
                continue
            frontier = min(c.last_key() for c in live)
            pieces = [p for c in live if (p := c.take_through(frontier)) is not None]
            # Concatenated in source order, then a stable sort: equal keys keep that order.
            writer.add(sort_rows(pa.concat_tables(pieces), keys))
    finally:
        writer.close()
        # Hand freed buffers back to the OS, so one table's merge does not stay in the RSS.
        pa.default_memory_pool().release_unused()
    return writer.rows


def _sorted_sources(sources: Sequence[tuple[Path, bool]], keys: Sequence[str],
                    scratch: Path, temps: list[Path]) -> list[Path]:
    out = []
    for path, declared in sources:
        if not keys or declared or _is_sorted(path, keys):
            out.append(path)
            continue
        data = sort_rows(pq.read_table(path), keys)  # one unsorted part (a batch) at a time
        tmp = scratch / f"sorted-{uuid.uuid4().hex[:12]}.parquet"
        temps.append(tmp)
        pq.write_table(data, tmp, compression="zstd", sorting_columns=sorting_columns(data.schema, keys))
        out.append(tmp)
    return out


def merge_sorted(
    sources: Sequence[Path],
    dest: Path,
    keys: Sequence[str],
    *,
    dedupe: bool,
    scratch: Path,
    budget: int | None = None,
    fan_in: int | None = None,
) -> int:
    """Merge Parquet parts into one file at ``dest``, sorted by ``keys``, in bounded memory.

    ``sources`` are taken in order: of rows with equal keys the earliest source's comes first,
    and with ``dedupe`` only that one is kept. Columns are the union of the sources' (a column
    a source lacks is null there). Intermediate files go to ``scratch`` and are removed.
    ``budget`` and ``fan_in`` default to :data:`MEMORY_BUDGET` and :data:`FAN_IN`.
    Returns the number of rows written.
    """
    if not sources:
        raise ValueError("merge_sorted needs at least one source")
    budget = budget or MEMORY_BUDGET
    fan_in = fan_in or FAN_IN
    # One look at each source's footer, kept only as its schema and whether it says it is
    # sorted (a run may have thousands of parts; their footers would add up).
    footers, schemas = [], []
    for path in sources:
        pf = pq.ParquetFile(path)
        footers.append((Path(path), _declares_sorted(pf.metadata, pf.schema_arrow, keys)))
        schemas.append(pf.schema_arrow)
        del pf
    schema = pa.unify_schemas(schemas, promote_options="default").remove_metadata()
    del schemas
    keys = [k for k in keys if k in schema.names]
    scratch.mkdir(parents=True, exist_ok=True)
    temps: list[Path] = []
    try:
        level = _sorted_sources(footers, keys, scratch, temps)
        m = _Merge(schema, keys, dedupe, budget, _row_bytes(level))
        while len(level) > fan_in:
            merged = []
            for i in range(0, len(level), fan_in):
                tmp = scratch / f"merge-{uuid.uuid4().hex[:12]}.parquet"
                temps.append(tmp)
                _merge_group(level[i : i + fan_in], tmp, m, final=False)
                merged.append(tmp)
            for done in level:  # an intermediate file is read once
                if done in temps:
                    done.unlink(missing_ok=True)
            level = merged
        return _merge_group(level, dest, m, final=True)
    finally:
        for tmp in temps:
            tmp.unlink(missing_ok=True)
