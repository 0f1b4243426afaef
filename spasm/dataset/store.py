"""The run directory's writer: the only code that writes its Parquet tables (docs/format.md, "Writing it").

Layout of ``runs/<name>/`` (docs/format.md is the full description)::

    config.json            the resolved run config (env var names only, never keys)
    manifest.json          versions, seed, counts, usage, timing, schema version
    personas.parquet/      one directory per table, each holding Parquet part files
    dialogues.parquet/
    turns.parquet/
    calls.parquet/
    errors.parquet/
    persona_rejections.parquet/
    cache.sqlite           the request cache (replays instead of paying on a rerun)
    .commits/              one empty marker per committed batch
    .tmp/                  parts being written (never inside a table directory)

Crash safety: a batch is written part by part into ``.tmp/`` and moved into place with
``os.replace`` (atomic), then its marker is created in ``.commits/``. On resume, parts without a
marker are deleted, so a batch is either wholly there or not at all. At the end the parts of
each table are compacted into one sorted part.

Every row is checked against its table's row model (:mod:`spasm.dataset.rows`): a misspelled
or undeclared field is a :class:`~spasm.errors.FormatError`, never a silent null.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import ValidationError

from spasm.dataset.files import atomic_write_json
from spasm.dataset.integrity import Damage, covered_batches, find_damage, part_record
from spasm.dataset.outputs import aside_path
from spasm.dataset.persona_rows import persona_row_model, rejection_row_model
from spasm.dataset.rows import (
    ROW_MODELS,
    ActionDialogueRow,
    DialogueRow,
    GroupTurnRow,
    ParticipantRow,
    Row,
    ScenarioDialogueRow,
    TurnRow,
    arrow_schema,
    human_row_model,
    with_trial_column,
)
from spasm.dataset.streaming import merge_sorted, sort_rows, sorting_columns
from spasm.errors import FormatError

__all__ = ["RunStore", "rows_to_table", "table_keys", "write_finished_run"]

RowLike = Row | Mapping[str, Any]


def _validation_message(table: str, exc: ValidationError) -> str:
    problems = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(p) for p in err["loc"]) or "(row)"
        kind = "undeclared field (misspelled?)" if err["type"] == "extra_forbidden" else err["msg"]
        problems.append(f"{loc}: {kind}")
    return f"a row for the {table} table does not match its schema: " + "; ".join(problems)


def rows_to_table(table: str, model: type[Row], rows: Sequence[RowLike]) -> pa.Table:
    """Check ``rows`` against ``model`` and build the Arrow table of ``table``."""
    records: list[dict[str, Any]] = []
    for row in rows:
        if isinstance(row, model) and type(row) is not model:  # its extra columns would be lost
            raise FormatError(f"a {type(row).__name__} cannot be written to the {table} table of "
                              "this run (a run with scenarios declares them first)")
        if isinstance(row, model):
            records.append(row.as_record())
            continue
        if isinstance(row, Row):
            raise FormatError(f"a {type(row).__name__} cannot be written to the {table} table")
        try:
            records.append(model.model_validate(_without_absent(table, model, row)).as_record())
        except ValidationError as exc:
            raise FormatError(_validation_message(table, exc)) from None
    return pa.Table.from_pylist(records, arrow_schema(model))


def _without_absent(table: str, model: type[Row], row: RowLike) -> RowLike:
    """A row as a reader returns it, less the columns this run's table does not have: readers
    show every column of the format (null where a run lacks it, e.g. the scenario columns of a
    run without scenarios), so a row read from one run can be written to another. Only null
    values of columns the format declares are dropped; anything else still fails validation."""
    if not isinstance(row, Mapping):
        return row
    known = ROW_MODELS.get(table)
    if known is None or known is model:
        return row
    absent = [k for k, v in row.items()
              if v is None and k not in model.model_fields and k in known.model_fields]
    return {k: v for k, v in row.items() if k not in absent} if absent else row


#: Sort and de-duplication keys of the personas tables, whose models depend on the schema.
_PERSONA_KEYS = {"personas": persona_row_model([], set()).keys,
                 "persona_rejections": rejection_row_model([], set()).keys}


def table_keys(table: str) -> tuple[str, ...]:
    """The sort and de-duplication keys of a table (``()`` for a table spasm does not know)."""
    model = ROW_MODELS.get(table)
    return model.keys if model is not None else _PERSONA_KEYS.get(table, ())


class RunStore:
    """Writes (and, for the engine's own bookkeeping, reads) the tables of one run directory.

    Readers outside generation use :func:`spasm.dataset.open_run`.
    """

    def __init__(self, run_dir: Path) -> None:
        self.dir = Path(run_dir)
        self.tmp = self.dir / ".tmp"
        self.commits = self.dir / ".commits"
        self.models: dict[str, type[Row]] = dict(ROW_MODELS)
        # The scenario columns only in runs with scenarios (declare_scenarios), the group
        # columns only in group runs (declare_group).
        self.models["dialogues"] = DialogueRow
        self.models["turns"] = TurnRow
        self.models["participants"] = ParticipantRow

    def declare_scenarios(self) -> None:
        """This run has scenarios: its dialogues table has the scenario columns."""
        self.models["dialogues"] = ScenarioDialogueRow

    def declare_tools(self) -> None:
        """This run has tools: its dialogues table has the scenario and reward columns."""
        self.models["dialogues"] = ActionDialogueRow

    def declare_trials(self) -> None:
        """This run has trials: its dialogues table has ``trial`` last (after the scenario
        columns, so declare scenarios first)."""
        model = self.models["dialogues"]
        assert issubclass(model, DialogueRow)
        self.models["dialogues"] = with_trial_column(model)

    def declare_group(self) -> None:
        """This run holds group dialogues: its turns have the group columns."""
        self.models["turns"] = GroupTurnRow

    def declare_humans(self) -> None:
        """This run has a seat a person takes: its dialogues, turns and participants have the
        human-seat columns (after the scenario and group columns, so declare those first)."""
        for table in ("dialogues", "turns", "participants"):
            self.models[table] = human_row_model(self.models[table])

    def set_persona_fields(self, field_names: Iterable[str], integer_fields: set[str], *,
                           source: bool = False) -> None:
        """Declare the persona-schema fields (the personas tables have one column per field),
        and whether the personas come from a data file (a ``source_id`` column)."""
        names = list(field_names)
        self.models["personas"] = persona_row_model(names, integer_fields, source=source)
        self.models["persona_rejections"] = rejection_row_model(names, integer_fields,
                                                                source=source)

    def model(self, table: str) -> type[Row]:
        """The row model of ``table``."""
        try:
            return self.models[table]
        except KeyError:
            raise FormatError(
                f"unknown table {table!r} (declare the persona fields first for personas)"
            ) from None

    def create(self) -> None:
        for d in (self.dir, self.tmp, self.commits):
            d.mkdir(parents=True, exist_ok=True)

    def table_dir(self, table: str) -> Path:
        return self.dir / f"{table}.parquet"

    def write_json(self, name: str, data: Any) -> None:
        """Write a JSON file of the run directory (manifest, config) atomically."""
        atomic_write_json(self.dir / name, data)

    # -- writing --------------------------------------------------------------------------
    def _write_part(self, table: str, data: pa.Table, name: str) -> dict[str, Any]:
        keys = self.model(table).keys
        # Sorted, and marked so, because compaction and merge k-way merge sorted parts.
        data = sort_rows(data, keys)
        tmp = self.tmp / f"{table}-{name}"
        try:
            pq.write_table(data, tmp, compression="zstd",
                           sorting_columns=sorting_columns(data.schema, keys))
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
            record = part_record(tmp, data.num_rows)
            record["file"] = name
            target_dir = self.table_dir(table)
            target_dir.mkdir(exist_ok=True)
            os.replace(tmp, target_dir / name)
        except BaseException:
            tmp.unlink(missing_ok=True)  # a full disk or an interrupt leaves no temp file
            raise
        return record

    def write_batch(
        self, batch_id: str, tables: Mapping[str, Sequence[RowLike]], allow_empty: bool = False
    ) -> None:
        """Write one batch to every table it has rows for, then commit it with a marker.

        Every row is checked (and each table built) before anything is written, so a bad row
        leaves no part behind.
        """
        built = {table: rows_to_table(table, self.model(table), rows)
                 for table, rows in tables.items() if rows or allow_empty}
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.commits.mkdir(parents=True, exist_ok=True)
        name = f"part-{batch_id}.parquet"
        parts = {table: self._write_part(table, data, name) for table, data in built.items()}
        # The marker is the commit: it names each part with its row count and checksum.
        atomic_write_json(self.commits / batch_id, {"parts": parts})

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
                if job.get("marker") and not (self.commits / job["marker"]).exists():
                    self.commits.mkdir(parents=True, exist_ok=True)  # the swap's own commit
                    atomic_write_json(self.commits / job["marker"], job["commit"])
                for p in job["replaces"]:
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(p)
                        removed += 1
                    name = Path(p).name
                    if name.startswith("part-compacted-"):  # its marker goes with it
                        with contextlib.suppress(FileNotFoundError):
                            os.remove(self.commits / name[len("part-") : -len(".parquet")])
            journal.unlink()
        for tmp in self.tmp.glob("*"):
            tmp.unlink()
            removed += 1
        committed = {p.name for p in self.commits.glob("*")}
        for table_dir in self.dir.glob("*.parquet"):
            if not table_dir.is_dir():
                continue
            for part in table_dir.glob("part-*.parquet"):
                batch = part.name[len("part-") : -len(".parquet")]
                if batch not in committed and not batch.startswith("compacted"):
                    part.unlink()
                    removed += 1
        return removed

    def repair(self) -> list[Damage]:
        """Find committed parts that are damaged or missing and remove what depends on them, so
        the dialogues they held are redone (from the cache, mostly). A damaged batch loses all
        its parts; a damaged compacted part loses every table's parts (its rows span batches).
        Returns what was found."""
        damage = find_damage(self.dir)
        if not damage:
            return []
        if any(d.batch.startswith("compacted") for d in damage):
            for table_dir in self.dir.glob("*.parquet"):
                if table_dir.is_dir():
                    shutil.rmtree(table_dir)
            shutil.rmtree(self.commits, ignore_errors=True)
            self.commits.mkdir()
            return damage
        for batch in {d.batch for d in damage}:
            for part in self.dir.glob(f"*.parquet/part-{batch}.parquet"):
                part.unlink()
            (self.commits / batch).unlink(missing_ok=True)
        return damage

    # -- reading (the engine's bookkeeping) -------------------------------------------------
    def parts(self, table: str) -> list[Path]:
        d = self.table_dir(table)
        return sorted(d.glob("part-*.parquet")) if d.is_dir() else []

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
        """Merge a table's parts into one part, sorted and de-duplicated by key.

        A streaming k-way merge of the sorted parts (:mod:`spasm.dataset.streaming`): memory
        stays bounded however large the table. Of rows with equal keys the earliest batch's is
        kept.
        """
        parts = self.parts(table)
        if not parts or (len(parts) == 1 and parts[0].name.startswith("part-compacted")):
            return  # nothing to merge, and already sorted
        self.merge_parts(table, parts, replaces=parts)

    def merge_parts(
        self, table: str, sources: Sequence[Path], *, replaces: Sequence[Path] = (), dedupe: bool = True
    ) -> None:
        """Stream ``sources`` (Parquet parts, here or in other runs: ``spasm merge``) into one
        sorted part of ``table`` that replaces ``replaces``, committed with its own marker."""
        self.tmp.mkdir(parents=True, exist_ok=True)
        name = f"part-compacted-{uuid.uuid4().hex[:8]}.parquet"
        tmp = self.tmp / name
        keys = self.models[table].keys if table in self.models else table_keys(table)
        rows = merge_sorted(list(sources), tmp, keys, dedupe=dedupe, scratch=self.tmp)
        self._publish_file(table, tmp, rows, list(replaces))

    def _publish(self, table: str, data: pa.Table, replaces: list[Path]) -> None:
        """Move ``data`` in as the table's one compacted part, replacing ``replaces``."""
        self.tmp.mkdir(parents=True, exist_ok=True)
        tmp = self.tmp / f"part-compacted-{uuid.uuid4().hex[:8]}.parquet"
        pq.write_table(data, tmp, compression="zstd")
        self._publish_file(table, tmp, data.num_rows, replaces)

    def _publish_file(self, table: str, tmp: Path, rows: int, replaces: list[Path]) -> None:
        """Move the written part ``tmp`` (in ``.tmp/``, named ``part-compacted-*``) in as the
        table's one compacted part, replacing ``replaces``; a journal lets :meth:`recover`
        finish the swap after a crash (never both, never none)."""
        name = tmp.name
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        record = part_record(tmp, rows)
        record["file"] = name
        result = self.table_dir(table) / name
        result.parent.mkdir(exist_ok=True)
        # The marker names what the part supersedes (content): integrity never reads mtimes.
        marker = name[len("part-") : -len(".parquet")]
        commit = {"parts": {table: record}, "supersedes": covered_batches(self.dir, table, replaces)}
        atomic_write_json(self.dir / ".compaction.json",
                          {"result": str(result), "replaces": [str(p) for p in replaces],
                           "marker": marker, "commit": commit})
        os.replace(tmp, result)
        self.commits.mkdir(exist_ok=True)
        atomic_write_json(self.commits / marker, commit)
        for p in replaces:
            with contextlib.suppress(FileNotFoundError):
                os.remove(p)
            if p.name.startswith("part-compacted-"):  # its marker goes with it
                with contextlib.suppress(FileNotFoundError):
                    os.remove(self.commits / p.name[len("part-") : -len(".parquet")])
        (self.dir / ".compaction.json").unlink()

    def replace_table(self, table: str, rows: Sequence[RowLike]) -> None:
        """Replace a whole table (e.g. the ``qa`` findings of a new scan) in one commit:
        a crash leaves the old table or the new one, and :meth:`recover` finishes the swap."""
        self._publish(table, rows_to_table(table, self.model(table), rows), self.parts(table))

    def ensure_tables(self, tables: Iterable[str]) -> None:
        """Give every named table at least an empty, typed part, so readers always find it."""
        missing = [t for t in tables if not self.parts(t) and t in self.models]
        if missing:
            self.write_batch("empty", {t: [] for t in missing}, allow_empty=True)

    def compact_all(self) -> None:
        for d in sorted(self.dir.glob("*.parquet")):
            if d.is_dir():
                self.compact(d.name[: -len(".parquet")])


def _has_people(tables: Mapping[str, Sequence[RowLike]]) -> bool:
    """Whether rows to write say who filled a seat (the 1.10 columns: ``client_kind``,
    ``responder_kind``, a participant's ``kind``), so the run gets the human-seat columns."""
    def said(row: RowLike, columns: tuple[str, ...]) -> bool:
        get = row.get if isinstance(row, Mapping) else row.__dict__.get
        return any(get(c) is not None for c in columns)

    return (any(said(r, ("client_kind", "responder_kind")) for r in tables.get("dialogues", ()))
            or any(said(r, ("kind",)) for r in tables.get("participants", ())))


def write_finished_run(
    out: Path,
    tables: Mapping[str, Sequence[RowLike]],
    manifest: Mapping[str, Any],
    *,
    persona_fields: tuple[Iterable[str], set[str]],
    replace: bool = False,
) -> None:
    """Write a complete run in one step (an import, a fixture): staged in a hidden directory
    beside ``out``, compacted, then moved into place. With ``replace`` an existing ``out`` is
    moved aside first and deleted only once the new run is in place; on any failure the
    staging directory is removed and ``out`` is as it was."""
    out = Path(out)
    stage = out.parent / f".{out.name}.staging-{uuid.uuid4().hex[:8]}"
    old = aside_path(out)
    try:
        store = RunStore(stage)
        store.create()
        store.set_persona_fields(*persona_fields)
        if tables.get("participants"):  # a group run: its turns have the group columns
            store.declare_group()
        if tables.get("events") is not None:  # a run with tools: its dialogues' rewards
            store.declare_tools()
        if _has_people(tables):  # a person in a seat (an import of people's conversations)
            store.declare_humans()
        store.write_batch("000001", tables)
        store.ensure_tables(("personas", "dialogues", "turns"))
        store.compact_all()
        store.write_json("manifest.json", dict(manifest))
        for leftover in (store.tmp,):
            leftover.rmdir()
        if out.exists() and (replace or not any(out.iterdir())):
            os.replace(out, old)
        os.replace(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        if old.exists() and not out.exists():
            os.replace(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)
