"""docs/format.md is the one description of the run directory: its column tables must match
the row models column for column, in order, so the doc cannot drift from the code."""

from __future__ import annotations

import re
from pathlib import Path

from spasm.dataset.persona_rows import persona_row_model, rejection_row_model
from spasm.dataset.rows import ROW_MODELS, SCHEMA_VERSION, arrow_schema
from spasm.personas.schema import load_schema

DOC = Path(__file__).resolve().parent.parent / "docs" / "format.md"


def _documented() -> dict[str, list[tuple[str, str]]]:
    tables: dict[str, list[tuple[str, str]]] = {}
    current = None
    for line in DOC.read_text(encoding="utf-8").splitlines():
        heading = re.match(r"### `(\w+)`", line)
        if heading:
            current = heading.group(1)
            tables[current] = []
            continue
        row = re.match(r"\| `(\w+)` \| ([\w\[\], =]+) \|", line)
        if current and row:
            tables[current].append((row.group(1), row.group(2).strip()))
    return tables


def test_format_doc_lists_every_column_of_every_table_in_order() -> None:
    schema = load_schema(None)
    models = {"personas": persona_row_model(schema.field_names, schema.integer_fields()),
              "persona_rejections": rejection_row_model(schema.field_names, schema.integer_fields()),
              **ROW_MODELS}
    documented = _documented()
    assert set(documented) == set(models)
    for table, model in models.items():
        declared = [(f.name, str(f.type)) for f in arrow_schema(model)]
        assert documented[table] == declared, table
    assert f"format {SCHEMA_VERSION}" in DOC.read_text(encoding="utf-8").splitlines()[0]
