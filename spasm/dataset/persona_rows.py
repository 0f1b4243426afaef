"""The personas and persona-rejections tables: their row models, one column per persona-schema
field around the fixed columns, and the :class:`~spasm.personas.persona.Persona` each personas
row is to code.

The fixed columns are declared once, by :class:`~spasm.personas.persona.Persona`'s attributes
(each names its column); :data:`PERSONA_HEAD`, :data:`PERSONA_TAIL` and :data:`SOURCE_COLUMN`
derive from them. A persona is made from a table record by :func:`persona_of` and written back
by :func:`persona_record`; nothing else reads a persona's columns by name.

This module, not :mod:`spasm.dataset.rows`, holds them: the LLM call path and the dialogue loop
import ``rows`` and know no persona definitions (the import-linter contracts in pyproject.toml).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, ClassVar

import pyarrow as pa
from pydantic import create_model

from spasm.dataset.rows import I64, INT32, INT64, STRING, OptStr, Row, Str
from spasm.errors import FormatError
from spasm.personas.persona import Persona

__all__ = [
    "ID_CARD_COLUMNS",
    "PERSONA_HEAD",
    "PERSONA_TAIL",
    "SOURCE_COLUMN",
    "cards_of",
    "persona_of",
    "persona_record",
    "persona_row",
    "persona_row_model",
    "rejection_row_model",
]


class _PersonaBase(Row):
    table: ClassVar[str] = "personas"
    keys: ClassVar[tuple[str, ...]] = ("persona_index",)


class _RejectionBase(Row):
    table: ClassVar[str] = "persona_rejections"
    keys: ClassVar[tuple[str, ...]] = ("draw",)


#: The Python type of each kind of :class:`Persona` attribute that is a column.
_PERSONA_TYPES: dict[str, Any] = {"str": str, "int": int, "str | None": str | None}


def _persona_columns() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The personas table's fixed columns, derived from :class:`Persona`'s attributes (each
    names its column): those before ``fields`` (the schema's columns go there), those after,
    and the column only runs whose personas come from a data file have."""
    head: dict[str, Any] = {}
    tail: dict[str, Any] = {}
    source: dict[str, Any] = {}
    into = head
    for attr in dataclasses.fields(Persona):
        column = attr.metadata["column"]
        if column is None:  # ``fields``: the schema's own columns
            into = tail
            continue
        python = _PERSONA_TYPES[str(attr.type)]
        kind = STRING if python is not int else INT32 if attr.metadata.get("int32") else INT64
        default = ... if attr.default is dataclasses.MISSING else attr.default
        (source if attr.metadata.get("source") else into)[column] = (Annotated[python, kind],
                                                                   default)
    return head, tail, source


#: The columns of the personas table around the persona-schema fields (from :class:`Persona`).
PERSONA_HEAD, PERSONA_TAIL, SOURCE_COLUMN = _persona_columns()
#: ``SOURCE_COLUMN``: the column a run whose personas come from a data file has after the
#: others: the row's id in that file (its id column, else its 0-based position). Only such runs
#: have it, so the personas of every other run keep the columns they had.

#: Persona attribute → its column, and back.
_COLUMN_OF: dict[str, str] = {
    a.name: a.metadata["column"] for a in dataclasses.fields(Persona) if a.metadata["column"]
}
_ATTR_OF: dict[str, str] = {column: attr for attr, column in _COLUMN_OF.items()}
#: The columns of a persona's id and its card: all that a reader of cards alone (the export's
#: persona prompts, the play page's list of personas) reads of the personas table.
ID_CARD_COLUMNS: tuple[str, str] = (_COLUMN_OF["id"], _COLUMN_OF["card"])
#: The columns a persona's record holds only when they are set: a persona the stage builds
#: without a policy (or not from a data file) never had them, and a shard's manifest hashes
#: those records (``runplan.personas_digest``), so the digest stays the one they always gave.
_ONLY_WHEN_SET = ("policy", "policy_version", "persona_fields", "source_id")


def persona_of(record: Mapping[Any, Any], *, place: int | None = None,
               card: str | None = None) -> Persona:
    """A record (a table row as a mapping: pandas, Arrow or a plain dict) as a :class:`Persona`:
    each fixed column to its attribute, every other column to ``fields`` (in the record's
    order). Values are taken as the record holds them.

    Keys become strings; a record without a string ``persona_id`` and ``card`` is not a
    persona, nor one without an integer ``persona_index`` unless ``place`` (the record's place
    in a table that has none) stands for it: a :class:`~spasm.errors.FormatError`. ``card``
    stands for a record's missing card the same way: the evaluation reads personas tables
    other tools wrote, which may hold only ``persona_id``, and gives such a persona the card
    ``""``, no card (as an imported conversation's persona has; the stages that need a card say
    that these have none).
    """
    row = {str(k): v for k, v in record.items()}
    if card is not None and not isinstance(row.get("card"), str):
        row["card"] = card
    _check(row)
    index = row.get("persona_index")
    if index is None or (isinstance(index, float) and math.isnan(index)):
        if place is None:
            raise FormatError(f"a persona needs persona_index (its place in the set); this one "
                              f"has {', '.join(sorted(row))}")
        index = place
    try:
        number = int(index)
    except (TypeError, ValueError, OverflowError):
        raise FormatError(f"persona {row['persona_id']!r}: persona_index {index!r} is not an "
                          "integer (its place in the set)") from None
    fixed = {_ATTR_OF[k]: v for k, v in row.items() if k in _ATTR_OF}
    fixed["index"] = number
    fields = {k: v for k, v in row.items() if k not in _ATTR_OF}
    return Persona(**fixed, fields=fields)


def _check(row: Mapping[str, Any]) -> None:
    """Without a string ``persona_id`` and ``card`` a record is not a persona (a
    :class:`~spasm.errors.FormatError`)."""
    missing = [k for k in ("persona_id", "card") if not isinstance(row.get(k), str)]
    if missing:
        raise FormatError(f"a persona needs {' and '.join(missing)} (a string); this one has "
                          f"{', '.join(sorted(row)) or 'no fields'}")


def persona_row(record: Mapping[Any, Any]) -> dict[str, Any]:
    """A record with a string ``persona_id`` and ``card`` (else a
    :class:`~spasm.errors.FormatError`), as a plain dict with string keys, every column as
    stored: what ``DialogueView.persona`` hands a user (the public reader has always given a
    dict)."""
    row = {str(k): v for k, v in record.items()}
    _check(row)
    return row


def cards_of(table: pa.Table) -> dict[Any, Any]:
    """Each persona's card by its id, both as stored, from a personas table that has
    :data:`ID_CARD_COLUMNS` (read column-wise: an export reads no other column)."""
    ids, cards = (table.column(c).to_pylist() for c in ID_CARD_COLUMNS)
    return dict(zip(ids, cards, strict=True))


def persona_record(persona: Persona) -> dict[str, Any]:
    """A persona as the record the personas table stores: its fixed columns around the schema's
    fields, in the table's column order (``policy``, ``policy_version``, ``persona_fields`` and
    ``source_id`` only when set)."""
    head = {c: getattr(persona, _ATTR_OF[c]) for c in PERSONA_HEAD}
    tail = {c: getattr(persona, _ATTR_OF[c]) for c in (*PERSONA_TAIL, *SOURCE_COLUMN)}
    for column in _ONLY_WHEN_SET:
        if tail[column] is None:
            del tail[column]
    return {**head, **persona.fields, **tail}


def _field_types(field_names: Iterable[str], integer_fields: set[str]) -> dict[str, Any]:
    return {
        f: ((Annotated[int | None, INT64], None) if f in integer_fields else (OptStr, None))
        for f in field_names
    }


def persona_row_model(field_names: Iterable[str], integer_fields: set[str], *,
                      source: bool = False) -> type[Row]:
    """The personas row model for one persona schema: fixed columns plus one per field, and
    ``source_id`` last when the personas come from a data file."""
    fields = {**PERSONA_HEAD, **_field_types(field_names, integer_fields), **PERSONA_TAIL,
              **(SOURCE_COLUMN if source else {})}
    model: type[Row] = create_model("PersonaRow", __base__=_PersonaBase, **fields)
    return model


def rejection_row_model(field_names: Iterable[str], integer_fields: set[str], *,
                        source: bool = False) -> type[Row]:
    """Rejected persona candidates, with the stage and reasons (and, for a data file, the
    row's ``source_id``; ``draw`` is then the row's position in the file)."""
    fields = {"draw": (I64, ...), **_field_types(field_names, integer_fields),
              "stage": (Str, ...), "reasons": (Str, ...), **(SOURCE_COLUMN if source else {})}
    model: type[Row] = create_model("PersonaRejectionRow", __base__=_RejectionBase, **fields)
    return model
