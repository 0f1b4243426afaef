"""The run format's one owner: typed rows, the writer, the reader, import and fixtures.

================  =====================================================================
Module            What it owns
================  =====================================================================
``rows``          the row model of every table and its Arrow schema (declared once)
``persona_rows``  the personas tables' row models, and a persona to a record and back
``store``         the only writer of a run directory's tables (batches, commits, compaction)
``files``         the only crash-safe file writer (temp file, fsync, ``os.replace``)
``reader``        :func:`open_run`: tables as Arrow/pandas/batches, one dialogue with what
                  each agent saw
``importer``      the public SPASM release (JSONL) into a run directory, and back
``synthetic``     synthetic run directories for tests, demos and benchmarks
================  =====================================================================

docs/format.md describes the run directory and its schema versions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spasm.lazy import lazy_exports

if TYPE_CHECKING:
    from spasm.dataset.reader import DialogueView, Run, SeenMessages, open_run, seen_messages
    from spasm.dataset.rows import (
        SCHEMA_VERSION,
        AnnotationRow,
        CallRow,
        DialogueRow,
        ErrorRow,
        QARow,
        TurnRow,
    )
    from spasm.dataset.store import RunStore

#: Each public name and the module that defines it (loaded on first use, PEP 562, so the
#: LLM layer can import the row models without loading the reader).
_HOMES = {
    "SCHEMA_VERSION": "spasm.dataset.rows",
    "AnnotationRow": "spasm.dataset.rows",
    "CallRow": "spasm.dataset.rows",
    "DialogueRow": "spasm.dataset.rows",
    "DialogueView": "spasm.dataset.reader",
    "ErrorRow": "spasm.dataset.rows",
    "QARow": "spasm.dataset.rows",
    "Run": "spasm.dataset.reader",
    "RunStore": "spasm.dataset.store",
    "SeenMessages": "spasm.dataset.reader",
    "TurnRow": "spasm.dataset.rows",
    "open_run": "spasm.dataset.reader",
    "seen_messages": "spasm.dataset.reader",
}

__all__ = [
    "SCHEMA_VERSION",
    "AnnotationRow",
    "CallRow",
    "DialogueRow",
    "DialogueView",
    "ErrorRow",
    "QARow",
    "Run",
    "RunStore",
    "SeenMessages",
    "TurnRow",
    "open_run",
    "seen_messages",
]


__getattr__, __dir__ = lazy_exports('spasm.dataset', globals(), _HOMES)
