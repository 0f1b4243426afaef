"""Human labels in the viewer: written only through the dataset package, read back cheaply.

Each label is one :class:`~spasm.dataset.rows.AnnotationRow` appended with
``RunStore.write_batch`` (its own batch and commit marker: a crash leaves the label wholly there
or not at all). Nothing is ever overwritten: the latest label of an annotator on a dialogue wins
and the earlier ones stay in the table. The book keeps the labels in memory (they are few next
to the turns) and reads only the parts it has not seen yet, so another viewer labelling the same
run is picked up on the next request.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import duckdb
import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, field_validator

from spasm.dataset import AnnotationRow, RunStore, open_run
from spasm.dataset.lock import RunLock
from spasm.errors import UserError

__all__ = ["AnnotationBook", "LabelIn", "RunBusy"]

#: How long a label waits for another writer of the run (``spasm eval``'s call log, say).
LOCK_WAIT_S = 3.0


class RunBusy(UserError):
    """Another spasm command holds the run's write lock (the label was not saved)."""

_ANNOTATOR = re.compile(r"^[\w][\w .@+-]{0,63}$")


class LabelIn(BaseModel):
    """A label as the browser sends it."""

    model_config = ConfigDict(extra="forbid")

    dialogue_id: str = Field(max_length=300)
    annotator: str = Field(max_length=64)
    echoing: Literal["none", "client", "responder", "both"] | None = None
    role_flip: bool | None = None
    note: str | None = Field(None, max_length=5000)

    @field_validator("annotator")
    @classmethod
    def _name(cls, value: str) -> str:
        value = value.strip()
        if not _ANNOTATOR.match(value):
            raise ValueError("an annotator name is 1-64 letters, digits, spaces or . @ + - _")
        return value


def _order(row: dict[str, Any]) -> tuple[datetime, str]:
    when = row.get("labelled_at") or datetime.min.replace(tzinfo=UTC)
    return when, str(row.get("annotation_id") or "")


class AnnotationBook:
    """The labels of one run: every label, and the latest per (dialogue, annotator)."""

    def __init__(self, run_dir: Path, clock: Callable[[], datetime] | None = None) -> None:
        self.run_dir = Path(run_dir)
        self._clock = clock or (lambda: datetime.now(UTC))
        self._lock = threading.Lock()
        self._write = threading.Lock()
        self._files: set[str] = set()
        self._count = 0
        self._latest: dict[str, dict[str, dict[str, Any]]] = {}
        self._history: dict[str, int] = {}
        self._rows: list[dict[str, Any]] = []
        self._raters: dict[str, int] = {}  # labels without an annotator, per dialogue
        self.refresh()

    # -- reading ----------------------------------------------------------------------------
    def refresh(self) -> None:
        """Read the committed annotation parts not read yet (all of them after a compaction)."""
        # Listing committed parts is cheap; the index verifies the run's checksums when it builds.
        files = {str(f) for f in open_run(self.run_dir, verify=False).files("annotations")}
        with self._lock:
            if not self._files <= files:  # parts were merged: start again
                self._files, self._latest, self._history, self._count = set(), {}, {}, 0
                self._rows, self._raters = [], {}
            new = sorted(files - self._files)
            if not new:
                return
            con = duckdb.connect(config={"autoinstall_known_extensions": False,
                                         "autoload_known_extensions": False, "threads": 1})
            try:
                rows = con.sql("SELECT * FROM read_parquet($f, union_by_name=true)",
                               params={"f": new}).to_arrow_table().to_pylist()
            finally:
                con.close()
            for row in rows:
                self._take(row)
            self._files |= set(new)

    def _take(self, row: dict[str, Any]) -> None:
        # The format used before the viewer (one annotations.parquet): a boolean echoing, maybe
        # no annotator, time or role flip. Read as `spasm eval` reads it (spasm.evaluation.
        # agreement): true is "yes", false "none", rows without an annotator are numbered raters.
        if isinstance(row.get("echoing"), bool | int):
            row["echoing"] = "yes" if row["echoing"] else "none"
        for column in AnnotationRow.model_fields:
            row.setdefault(column, None)
        did = str(row.get("dialogue_id"))
        if isinstance(row.get("annotator"), str) and row["annotator"]:
            who = row["annotator"]
        else:
            self._raters[did] = self._raters.get(did, 0) + 1
            who = f"rater{self._raters[did]}"
        row["annotator"] = who
        self._rows.append(row)
        self._count += 1
        self._history[did] = self._history.get(did, 0) + 1
        mine = self._latest.setdefault(did, {})
        if who not in mine or _order(row) >= _order(mine[who]):
            mine[who] = row

    def labels(self, dialogue_id: str) -> list[dict[str, Any]]:
        """The latest label of each annotator on a dialogue, by annotator name."""
        self.refresh()
        with self._lock:
            return [dict(r) for _, r in sorted(self._latest.get(dialogue_id, {}).items())]

    def all_rows(self) -> list[dict[str, Any]]:
        """Every label read so far, superseded ones included."""
        self.refresh()
        with self._lock:
            return [dict(r) for r in self._rows]

    def history_count(self, dialogue_id: str) -> int:
        """How many labels (superseded ones included) the dialogue has."""
        with self._lock:
            return self._history.get(dialogue_id, 0)

    def summary(self) -> dict[str, Any]:
        """Counts for the overview: labels, labelled dialogues, labels per annotator."""
        self.refresh()
        with self._lock:
            per: dict[str, int] = {}
            for labels in self._latest.values():
                for who in labels:
                    per[who] = per.get(who, 0) + 1
            return {"labels": self._count, "dialogues": len(self._latest), "annotators": dict(sorted(
                per.items()))}

    def status_table(self, annotator: str | None) -> pa.Table:
        """``(dialogue_id, n_annotators, mine)`` of every labelled dialogue, for list filters."""
        self.refresh()
        with self._lock:
            ids = list(self._latest)
            counts = [len(self._latest[d]) for d in ids]
            mine = [annotator is not None and annotator in self._latest[d] for d in ids]
        return pa.table({"dialogue_id": pa.array(ids, pa.string()),
                         "n_annotators": pa.array(counts, pa.int64()), "mine": pa.array(mine, pa.bool_())})

    def annotated(self) -> dict[str, list[str]]:
        """Dialogue id -> the annotators who labelled it (for the list's label column)."""
        with self._lock:
            return {d: sorted(labels) for d, labels in self._latest.items()}

    # -- writing ----------------------------------------------------------------------------
    def add(self, label: LabelIn) -> AnnotationRow:
        """Append one label to the run's annotations table (its own committed batch)."""
        if (self.run_dir / "annotations.parquet").is_file():
            raise UserError(
                f"{self.run_dir / 'annotations.parquet'} is a single file in the format used before "
                "`spasm view`; rename it (its labels then stop counting in `spasm eval`) to label here."
            )
        now = self._clock()
        row = AnnotationRow(
            annotation_id=uuid.uuid4().hex, dialogue_id=label.dialogue_id, annotator=label.annotator,
            echoing=label.echoing, role_flip=label.role_flip,
            note=label.note if label.note and label.note.strip() else None,
            labelled_at=now,
        )
        batch = f"annotation-{now.strftime('%Y%m%dT%H%M%S%f')}-{row.annotation_id[:8]}"
        with self._write:
            lock = self._run_lock()
            try:
                RunStore(self.run_dir).write_batch(batch, {"annotations": [row]})
            finally:
                lock.release()
        self.refresh()
        return row

    def _run_lock(self) -> RunLock:
        """The run's write lock, held only for one label: other commands write between labels."""
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                return RunLock(self.run_dir).acquire()
            except UserError as exc:
                if time.monotonic() >= deadline:
                    raise RunBusy(f"The label was not saved: {exc} Save it again when that command "
                                  "has finished.") from None
                time.sleep(0.1)
