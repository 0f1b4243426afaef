"""A persona as code passes it: who a Client is, one row of the personas table.

A :class:`Persona` is read from a table record and written back to one only by
:mod:`spasm.dataset.persona_rows` (``persona_of``, ``persona_record``); the persona stage, the
importer and synthetic runs build theirs and write them through ``persona_record``. Its
attributes are the personas table's fixed columns (each names its column in its metadata; the
table's Arrow schema derives from them), and ``fields`` holds the schema's own fields
(``first_name``, ``concern``, ``emotion``, …), which differ from schema to schema.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from spasm.personas.schema import LANGUAGE_FIELD

__all__ = ["Persona"]


def _column(name: str, default: Any = ..., **meta: Any) -> Any:
    """A fixed column of the personas table (``int32``: stored as a 32-bit integer; ``source``:
    only runs whose personas come from a data file have it)."""
    info = {"column": name, **meta}
    return field(metadata=info) if default is ... else field(default=default, metadata=info)


@dataclass(frozen=True, slots=True, kw_only=True)
class Persona:
    """One persona: its id, its place in the drawn set, the schema's fields, its card, what it
    passed, the policy compiled from its card, and where it came from.

    The column order of the personas table is the attributes' order, with the schema's fields
    where ``fields`` stands. ``fields`` is a plain mapping (never mutated once built), so a
    persona pickles (the Ray executor ships it) and compares by value.
    """

    id: str = _column("persona_id")
    #: The persona's 0-based place in the drawn set (a shard owns ``index % N``).
    index: int = _column("persona_index", int32=True)
    seed: int = _column("seed", 0)
    #: The schema's own fields, in the schema's order (a field can be ``None``).
    fields: Mapping[str, Any] = field(default_factory=dict, metadata={"column": None})
    card: str = _column("card")
    #: ``template``, ``llm`` (rewritten by the crafter) or a data file's.
    card_source: str = _column("card_source", "template")
    #: JSON: the validation verdicts the persona passed.
    verdicts: str = _column("verdicts", "[]")
    schema_name: str | None = _column("schema_name", None)
    schema_version: str | None = _column("schema_version", None)
    #: JSON: the CharacterPolicy compiled from the card, and its version (docs/harness.md,
    #: "The layers"); ``None`` when no level of the run compiles one.
    policy: str | None = _column("policy", None)
    policy_version: str | None = _column("policy_version", None)
    #: JSON: an imported persona's source fields, verbatim (column ``persona_fields``).
    source_fields: str | None = _column("persona_fields", None)
    #: The row id in the data file the persona came from (runs with ``personas.source``).
    source_id: str | None = _column("source_id", None, source=True)

    @property
    def language(self) -> str | None:
        """The schema's language field (a code, tag or English name), ``None`` when the persona
        has none (English: its frames say nothing about language)."""
        value = self.fields.get(LANGUAGE_FIELD)
        return value if isinstance(value, str) else None
