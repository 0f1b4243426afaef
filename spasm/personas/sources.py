"""Personas from a data file (README, "Personas from data"): CSV, JSONL, Parquet, or a directory saved by
the ``datasets`` library (``Dataset.save_to_disk``).

This module reads and checks; it calls no model. A row becomes a persona candidate:

* columns named like the persona schema's fields are those fields (case and surrounding spaces
  do not matter); ``field_map`` renames others (``{"job_title": "occupation"}``);
* a ``card`` column is the card, as written;
* otherwise a free-text ``description`` or ``persona`` column (PersonaHub style) becomes the card
  (``You are this person: …`` unless it already speaks to "you");
* otherwise the card is the template card of the row's fields;
* the row's id is the first of the columns ``source_id``, ``id``, ``uuid`` it has (or the column
  ``field_map`` maps to ``source_id``), else its position in the file (0-based), and is kept as
  ``source_id``; the whole row, verbatim, is kept as ``persona_fields`` (JSON).

The schema's integer fields must hold integers, and its coherence rules apply to every row that
has the fields a rule names. A row that fails is rejected with a reason naming its line and
column (the ``persona_rejections`` table); a file that cannot be read as a table at all (not
UTF-8, ragged CSV, invalid JSON, repeated ids or column names) is a :class:`UserError` naming
the file, the line and the column. The drift dimensions (concern, emotion, motivation) a row
with a free-text card lacks are extracted by the persona stage (:mod:`spasm.persona_stage`),
which calls the model.

The ``datasets`` directory is read with pyarrow (a core dependency): its ``state.json`` lists
the Arrow IPC stream files the rows are in, so reading them needs neither ``datasets`` (a dev
dependency only) nor its cache, and gives the same rows as ``datasets.load_from_disk``.
"""

from __future__ import annotations

import csv
import io
import json
import math
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spasm.errors import UserError
from spasm.jsontext import JSONProblem, read_json_object
from spasm.personas.crafter import render_persona_card
from spasm.personas.schema import PersonaSchema

__all__ = [
    "DIMENSIONS",
    "ID_COLUMNS",
    "SourceCandidate",
    "SourcePersonas",
    "load_source",
    "read_rows",
]

#: The persona fields persona drift is measured on (docs/evaluation.md; the drift dimension of
#: each is :data:`spasm.evaluation.drift.PERSONA_DIMENSIONS`, in the same order).
DIMENSIONS = ("concern", "emotion", "motivation")
#: Columns that hold a row's id, in the order they are looked for.
ID_COLUMNS = ("source_id", "id", "uuid")
#: Free-text columns that become the card when there is no ``card`` column, in this order.
TEXT_COLUMNS = ("description", "persona")
#: The longest card or description a row may have (the csv module's own limit on a cell, 128
#: KiB): a persona's card is sent with every one of its turns.
MAX_TEXT_CHARS = 131_072
#: What ``field_map`` may map a column to besides the schema's fields.
SPECIAL = ("card", "description", "source_id")
SUFFIXES = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet",
            ".pq": "parquet"}
_INT64 = (-(2**63), 2**63 - 1)


@dataclass
class SourceCandidate:
    """One usable row of the file, as a persona without its id (the stage numbers them)."""

    index: int
    where: str
    source_id: str
    fields: dict[str, Any]
    card: str
    #: ``source`` (a card column), ``description`` (a free-text column) or ``template``.
    card_source: str
    #: The row verbatim (JSON text), for ``personas.persona_fields``.
    raw: str

    def missing_dimensions(self, schema: PersonaSchema) -> list[str]:
        """The drift dimensions of the schema that this row has no value for, when its card is
        free text they can be read from (a template card holds nothing the fields do not)."""
        if self.card_source == "template":
            return []
        return [d for d in DIMENSIONS if d in schema.fields and self.fields.get(d) is None]


@dataclass
class SourcePersonas:
    """What a data file gives: the usable rows, the rejected ones and how columns were read."""

    path: Path
    rows: int = 0
    columns: list[str] = field(default_factory=list)
    #: source column -> persona field (or card, description, source_id).
    mapping: dict[str, str] = field(default_factory=dict)
    accepted: list[SourceCandidate] = field(default_factory=list)
    rejected: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ignored(self) -> list[str]:
        """Columns that are neither a field nor a card, text or id (kept in persona_fields)."""
        return [c for c in self.columns if c not in self.mapping]

    def sample(self, n: int | None, seed: int) -> list[SourceCandidate]:
        """``n`` rows drawn with ``seed`` (kept in file order), or every row when ``n`` is None."""
        if n is None:
            return list(self.accepted)
        if n > len(self.accepted):
            raise UserError(
                f"{self.path} has {len(self.accepted)} usable row(s) "
                f"({len(self.rejected)} rejected of {self.rows}); personas.n asks for {n}. "
                "Lower n, or leave it out to use every row.")
        chosen = sorted(random.Random(seed).sample(range(len(self.accepted)), n))
        return [self.accepted[i] for i in chosen]

    def describe(self) -> list[str]:
        """A preview: how the columns were read and what was kept (``spasm personas --from``)."""
        lines = [f"{self.path}: {self.rows} row(s), {len(self.accepted)} usable, "
                 f"{len(self.rejected)} rejected"]
        roles: dict[str, list[str]] = {}
        for column, target in self.mapping.items():
            roles.setdefault(target, []).append(column)
        for target in (*SPECIAL, "persona"):
            for column in roles.pop(target, []):
                lines.append(f"  column {column!r} → {target}")
        for target, cols in sorted(roles.items()):
            lines.extend(f"  column {c!r} → field {target}" for c in cols)
        ignored = self.ignored
        for column in [c for c in ignored if _key(c) == "scenario"]:  # scenarios.own_scenario
            lines.append(f"  column {column!r} → the persona's own scenario (a run with "
                         "scenarios runs only that one)")
            ignored.remove(column)
        if ignored:
            lines.append("  kept only in persona_fields: " + ", ".join(map(repr, ignored)))
        for rejection in self.rejected[:5]:
            lines.append(f"  rejected: {'; '.join(json.loads(rejection['reasons']))}")
        if len(self.rejected) > 5:
            lines.append(f"  … and {len(self.rejected) - 5} more rejected row(s)")
        return lines


# -- reading the file ------------------------------------------------------------------------
def _format(path: Path) -> str:
    if path.is_dir():
        return "datasets"
    kind = SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise UserError(
            f"{path}: cannot tell the format from the name; personas come from a .csv, .jsonl, "
            ".parquet file or a directory saved by datasets (Dataset.save_to_disk).")
    return kind


def read_rows(path: str | Path) -> tuple[list[str], Iterator[tuple[str, dict[str, Any]]]]:
    """The columns of a data file and its rows as ``(where, record)``; ``where`` is
    ``FILE:LINE`` for text files and ``FILE, row N`` (1-based) for Arrow ones."""
    p = Path(path)
    if not p.exists():
        raise UserError(f"Cannot read personas from {p}: no such file or directory.")
    kind = _format(p)
    if kind == "csv":
        return _csv_rows(p)
    if kind == "jsonl":
        return _jsonl_rows(p)
    table = _parquet_table(p) if kind == "parquet" else _datasets_table(p)
    names = list(table.schema.names)
    _unique_columns(p, names)

    def rows() -> Iterator[tuple[str, dict[str, Any]]]:
        done = 0
        for batch in table.to_batches(max_chunksize=4096):
            for record in batch.to_pylist():
                done += 1
                yield f"{p}, row {done}", record

    return names, rows()


def _read_bytes(p: Path) -> bytes:
    try:
        return p.read_bytes()
    except OSError as exc:
        raise UserError(f"Cannot read personas from {p}: {exc.strerror}.") from None


def _decode(p: Path, raw: bytes) -> str:
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        start = raw.rfind(b"\n", 0, exc.start) + 1
        column = ""
        if p.suffix.lower() == ".csv":
            column = _csv_cell(raw, start, exc.start)
        raise UserError(
            f"{p}:{line}{column}: not UTF-8 text (byte 0x{raw[exc.start]:02x}, byte "
            f"{exc.start - start + 1} of the line); save the file as UTF-8.") from None


def _csv_cell(raw: bytes, start: int, bad_byte: int) -> str:
    """``, column 'NAME'`` of the cell of a CSV line holding an undecodable byte (best effort:
    empty when the line cannot be split into cells)."""
    end = raw.find(b"\n", bad_byte)
    try:
        header = next(csv.reader([raw.split(b"\n", 1)[0].decode("utf-8-sig", "replace").strip()]), [])
        cells = next(csv.reader([raw[start: len(raw) if end < 0 else end]
                                 .decode("utf-8", "replace").strip()]), [])
    except csv.Error:
        return ""
    bad = next((i for i, c in enumerate(cells) if "\ufffd" in c), None)
    if bad is None:
        return ""
    return f", column {header[bad].strip()!r}" if bad < len(header) else f", cell {bad + 1}"


def _unique_columns(p: Path, names: list[str]) -> None:
    seen: dict[str, str] = {}
    for name in names:
        key = _key(name)
        if not key:
            raise UserError(f"{p}: a column has no name (column {names.index(name) + 1}); "
                            "name every column.")
        if key in seen:
            raise UserError(f"{p}: the columns {seen[key]!r} and {name!r} have the same name; "
                            "rename one.")
        seen[key] = name


def _csv_rows(p: Path) -> tuple[list[str], Iterator[tuple[str, dict[str, Any]]]]:
    text = _decode(p, _read_bytes(p))
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        header = next(reader, None)
    except csv.Error as exc:
        raise UserError(f"{p}:1: the header is not valid CSV ({exc}).") from None
    if not header or not any(h.strip() for h in header):
        raise UserError(f"{p}: the file is empty; the first line names the columns "
                        "(e.g. id,card or age,occupation,concern).")
    header = [h.strip() for h in header]
    _unique_columns(p, header)

    def rows() -> Iterator[tuple[str, dict[str, Any]]]:
        start = reader.line_num + 1
        while True:
            try:
                cells = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                if "field larger than field limit" in str(exc):
                    raise UserError(
                        f"{p}:{start}: a cell holds more than {csv.field_size_limit():,} characters "
                        "(128 KiB); a persona's card or field that long would be sent with every "
                        "turn: shorten it.") from None
                raise UserError(f"{p}:{start}: not valid CSV ({exc}).") from None
            where = f"{p}:{start}"
            start = reader.line_num + 1
            if not cells or not any(c.strip() for c in cells):
                continue
            if len(cells) != len(header):
                raise UserError(f"{where}: the row has {len(cells)} cell(s) and the header "
                                f"{len(header)}; quote cells that hold commas.")
            yield where, {h: (c if c.strip() else None) for h, c in zip(header, cells, strict=True)}

    return header, rows()


def _jsonl_rows(p: Path) -> tuple[list[str], Iterator[tuple[str, dict[str, Any]]]]:
    text = _decode(p, _read_bytes(p))
    records: list[tuple[str, dict[str, Any]]] = []
    columns: dict[str, str] = {}
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{p}:{line_no}"
        try:
            record = read_json_object(line)
        except JSONProblem as problem:
            if problem.kind == "syntax":
                raise UserError(f"{where}: not valid JSON ({problem.msg}, character "
                                f"{problem.column}).") from None
            hint = ('; each line is one persona, e.g. {"id": "a1", "description": "A retired '
                    'nurse ..."}') if problem.kind == "not_object" else ""
            raise UserError(f"{where}: {problem.reason}{hint}.") from None
        for key in record:
            other = columns.setdefault(_key(key), key)
            if other != key:
                raise UserError(f"{where}: the keys {other!r} and {key!r} name the same column; "
                                "use one spelling.")
        records.append((where, record))
    if not records:
        raise UserError(f"{p}: the file holds no persona (one JSON object per line).")
    names = list(columns.values())
    _unique_columns(p, names)
    return names, iter(records)


def _parquet_table(p: Path) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_table(p)
    except (OSError, pa.ArrowException) as exc:
        raise UserError(f"Cannot read {p} as Parquet ({exc}).") from None


def _datasets_table(p: Path) -> Any:
    """The rows of a ``Dataset.save_to_disk`` directory, from its Arrow files."""
    import pyarrow as pa

    if (p / "dataset_dict.json").is_file():
        splits = sorted(d.name for d in p.iterdir() if (d / "state.json").is_file())
        raise UserError(f"{p} holds several splits ({', '.join(splits) or 'none'}); name one, "
                        f"e.g. {p / (splits[0] if splits else 'train')}.")
    state = p / "state.json"
    files: list[Path] = []
    if state.is_file():
        try:
            listed = json.loads(state.read_text(encoding="utf-8"))["_data_files"]
            files = [p / str(entry["filename"]) for entry in listed]
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
            raise UserError(f"{state} is not the state.json that datasets writes; save the "
                            "dataset again with save_to_disk.") from None
    else:
        files = sorted(p.glob("*.arrow"))
    if not files:
        raise UserError(f"{p} is a directory without a dataset (no state.json or .arrow files); "
                        "name a .csv, .jsonl or .parquet file, or a directory saved by datasets.")
    tables = []
    for f in files:
        try:
            with pa.memory_map(str(f)) as source:
                tables.append(pa.ipc.open_stream(source).read_all())
        except (OSError, pa.ArrowException) as exc:
            raise UserError(f"Cannot read {f} as an Arrow file of a saved dataset ({exc}).") from None
    try:
        return pa.concat_tables(tables)
    except pa.ArrowException as exc:
        raise UserError(f"The Arrow files of {p} do not share one schema ({exc}).") from None


# -- rows to personas ------------------------------------------------------------------------
def _key(name: Any) -> str:
    return str(name).strip().lower()


def _mapping(p: Path, columns: list[str], schema: PersonaSchema,
             field_map: Mapping[str, str]) -> dict[str, str]:
    """source column -> target (a schema field, card, description or source_id)."""
    by_key = {_key(c): c for c in columns}
    targets = {*schema.fields, *SPECIAL}
    mapping: dict[str, str] = {}
    for column, target in field_map.items():
        found = column if column in columns else by_key.get(_key(column))
        if found is None:
            raise UserError(f"personas.field_map names column {column!r}, which {p} does not "
                            f"have (its columns: {', '.join(columns[:20])}).")
        if target not in targets:
            raise UserError(
                f"personas.field_map maps {column!r} to {target!r}, which is no field of the "
                f"persona schema ({', '.join(schema.fields)}) nor one of {', '.join(SPECIAL)}.")
        mapping[found] = target
    for column in columns:
        if column in mapping:
            continue
        key = _key(column)
        if key in schema.fields or key in ("card", *TEXT_COLUMNS):
            mapping[column] = key
    ids = [c for k in ID_COLUMNS for c in columns if _key(c) == k and c not in mapping]
    if ids and "source_id" not in mapping.values():
        mapping[ids[0]] = "source_id"
    # Both description and persona may be columns: a row's text is its description, else its
    # persona (a row with only one of them is not empty).
    seen: dict[str, str] = {}
    for column, target in mapping.items():
        norm = target
        if norm in seen:
            raise UserError(f"{p}: the columns {seen[norm]!r} and {column!r} both give "
                            f"{norm}; drop one or map it elsewhere with personas.field_map.")
        seen[norm] = column
    if not set(mapping.values()) - {"source_id"}:
        raise UserError(
            f"{p}: no column is a card, a description or a persona field (its columns: "
            f"{', '.join(columns[:20])}). Name a column card, description or persona, or like a "
            f"field of the schema ({', '.join(schema.fields)}), or map one with "
            "personas.field_map.")
    return mapping


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip()) or (
        isinstance(value, float) and math.isnan(value))


def _integer(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        text = value.strip()
        if text.lstrip("+-").isascii() and text.lstrip("+-").isdigit() and len(text) < 40:
            return int(text)
    return None


def _text(value: Any) -> str | None:
    """A cell as text: scalars as written, a list of scalars joined with ``; ``."""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, list | tuple) and all(
            isinstance(v, str | int | float) and not isinstance(v, bool) for v in value):
        return "; ".join(str(v).strip() for v in value)
    return None


def _describe(value: Any) -> str:
    shown = json.dumps(value, ensure_ascii=False, default=str)
    return shown if len(shown) <= 40 else shown[:39] + "…"


def description_card(text: str) -> str:
    """The card of a free-text description: in the second person, as cards are."""
    return text if text.lower().startswith(("you ", "you're", "your ")) else \
        f"You are this person: {text}"


def _row(where: str, record: dict[str, Any], mapping: dict[str, str], schema: PersonaSchema,
         ints: set[str]) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """The row's fields, its special values (card, description, source_id) and the reasons it
    cannot be used."""
    fields: dict[str, Any] = dict.fromkeys(schema.fields)
    special: dict[str, str] = {}
    texts: dict[str, str] = {}
    reasons: list[str] = []
    for column, target in mapping.items():
        value = record.get(column)
        if _missing(value):
            continue
        if target in ints:
            number = _integer(value)
            if number is None:
                reasons.append(f"{where}, column {column!r}: {_describe(value)} is not an integer "
                               f"({target} is an integer field)")
            elif not _INT64[0] <= number <= _INT64[1]:
                reasons.append(f"{where}, column {column!r}: {_describe(value)} is out of range "
                               "for an integer")
            else:
                fields[target] = number
            continue
        text = _text(value)
        if text is None:
            reasons.append(f"{where}, column {column!r}: {_describe(value)} is not text (an "
                           "object or a nested list)")
        elif target in schema.fields:
            fields[target] = text
        elif target in TEXT_COLUMNS:
            texts[target] = text
        else:
            special[target] = text
    first = next((texts[t] for t in TEXT_COLUMNS if t in texts), None)
    if first is not None:
        special["description"] = first
    for name in ("card", "description"):
        if len(special.get(name, "")) > MAX_TEXT_CHARS:
            reasons.append(f"{where}: the {name} holds {len(special[name]):,} characters, over "
                           f"{MAX_TEXT_CHARS:,} (about {MAX_TEXT_CHARS // 4:,} tokens, sent with "
                           "every turn of the persona); shorten it")
    return fields, special, reasons


def _rules(schema: PersonaSchema, fields: dict[str, Any]) -> list[str]:
    """The schema's rules that reject the row, counting only rules whose fields it has: a rule
    about age and occupation says nothing of a row without an age."""
    out = []
    for rule in schema.rules:
        if all(fields.get(f) is not None for f in (*rule.when, *rule.require)):
            reason = rule.violation(fields)
            if reason is not None:
                out.append(reason)
    return out


def load_source(path: str | Path, schema: PersonaSchema,
                field_map: Mapping[str, str] | None = None) -> SourcePersonas:
    """Read a persona file and check every row (no model is called).

    Raises:
        UserError: the file cannot be read as a table of personas, or its ids repeat; the
            message names the file, the line and the column.
    """
    p = Path(path)
    columns, rows = read_rows(p)
    mapping = _mapping(p, columns, schema, field_map or {})
    out = SourcePersonas(path=p, columns=columns, mapping=mapping)
    ints = schema.integer_fields()
    ids: dict[str, str] = {}
    contents: dict[str, str] = {}
    for index, (where, record) in enumerate(rows):
        out.rows += 1
        fields, special, reasons = _row(where, record, mapping, schema, ints)
        source_id = special.get("source_id")
        if source_id is None and "source_id" in mapping.values():
            id_column = next(c for c, t in mapping.items() if t == "source_id")
            reasons.append(f"{where}, column {id_column!r}: no id (every row needs one when the "
                           "file has an id column)")
        sid = source_id if source_id is not None else str(index)
        if source_id is not None:
            if sid in ids:
                raise UserError(f"{where}: the id {_describe(sid)} repeats {ids[sid]}; give each "
                                "row its own id.")
            ids[sid] = where
        card, card_source = special.get("card"), "source"
        if card is None and special.get("description"):
            card, card_source = description_card(special["description"]), "description"
        present = {k: v for k, v in fields.items() if v is not None}
        if card is None and present and not reasons:
            card, card_source = render_persona_card(present), "template"
        if not reasons and not card:
            reasons.append(f"{where}: no card, description or persona field (the row is empty "
                           f"in {', '.join(repr(c) for c, t in mapping.items() if t != 'source_id')})")
        if not reasons:
            reasons = [f"{where}: {r}" for r in _rules(schema, fields)]
            stage = "rules"
        else:
            stage = "source"
        if not reasons:
            content = json.dumps([card, present], sort_keys=True, ensure_ascii=False, default=str)
            if content in contents:
                reasons, stage = [f"{where}: the same card and fields as {contents[content]}"], \
                    "duplicate"
            else:
                contents[content] = where
        raw = json.dumps(record, ensure_ascii=False, sort_keys=True, default=str)
        if reasons:
            out.rejected.append({"draw": index, **fields, "stage": stage,
                                 "reasons": json.dumps(reasons, ensure_ascii=False),
                                 "source_id": sid})
            continue
        assert card is not None
        out.accepted.append(SourceCandidate(index, where, sid, fields, card, card_source, raw))
    if not out.accepted:
        top = "; ".join(json.loads(r["reasons"])[0] for r in out.rejected[:3])
        raise UserError(f"{p}: none of its {out.rows} row(s) is a usable persona"
                        + (f": {top}" if top else "") + ".")
    return out
