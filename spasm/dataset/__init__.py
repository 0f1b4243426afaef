"""The run format's one owner: typed rows, the writer, the reader, import and fixtures.

==============  =====================================================================
Module          What it owns
==============  =====================================================================
``rows``        the row model of every table and its Arrow schema (declared once)
``store``       the only writer of a run directory's tables (batches, commits, compaction)
``files``       the only crash-safe file writer (temp file, fsync, ``os.replace``)
``reader``      :func:`open_run`: tables as Arrow/pandas/batches, one dialogue with what
                each agent saw
``importer``    the public SPASM release (JSONL) into a run directory, and back
``synthetic``   synthetic run directories for tests, demos and benchmarks
==============  =====================================================================

docs/format.md describes the run directory and its schema versions.
"""

from __future__ import annotations

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
