"""The run directory's reader: :func:`open_run` (docs/format.md, "Reading it").

Everything that reads a run — evaluation, the harness report, export, the viewer, merge — reads
through a :class:`Run`. It reads only committed parts (a batch is visible once its commit
marker exists), fills columns an older schema version lacks with their declared defaults, and
gives each table as Arrow, as pandas, or in record batches for runs too large for memory::

    import spasm
    run = spasm.open_run("runs/smoke")
    run.dialogues                      # pandas DataFrame
    run.table("turns")                 # pyarrow Table
    for batch in run.batches("turns", columns=["dialogue_id", "text"]):
        ...
    d = run.dialogue(run.dialogues.dialogue_id[0])
    d.turns[0]["text"], d.seen(0).messages, d.seen(0).verified
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from spasm.backends.base import Message
from spasm.dataset.integrity import find_damage
from spasm.dataset.persona_rows import persona_row
from spasm.dataset.rows import ROW_MODELS, SCHEMA_VERSION, Row, arrow_schema
from spasm.errors import FormatError, UserError
from spasm.history import EVENT_KINDS, Event, History
from spasm.projection import Viewer, group_viewer, messages_digest, project

__all__ = ["DialogueView", "Run", "SeenMessages", "event_of", "events_by_dialogue", "open_run",
           "participant_viewer", "seen_messages"]


@dataclass(frozen=True)
class SeenMessages:
    """What an agent was sent for one turn, and whether it matches the stored digest."""

    messages: list[Message]
    #: sha256 of ``messages`` equals the turn's ``messages_sha256`` (``None``: no digest stored).
    verified: bool | None
    #: In a run with tools: the frame of each tool step of the turn, before the one that wrote
    #: the utterance (``messages``), which holds every one of them.
    steps: list[list[Message]] = field(default_factory=list)


def participant_viewer(
    dialogue: Mapping[str, Any], participants: Sequence[Mapping[str, Any]], speaker: str,
    system_prompt: str | None = None,
) -> Viewer | None:
    """The viewer of participant ``speaker`` of a group dialogue, rebuilt from its rows (the
    dialogue's and its participants'): its frame, everyone's ids in turn order and how it names
    the others; ``None`` when ``speaker`` has no seat (a two-party dialogue). ``system_prompt``
    replaces the stored one (an export's fallback for a run that stored none)."""
    seats = sorted(participants, key=lambda p: int(p["position"]))
    me = next((p for p in seats if p["participant_id"] == speaker), None)
    if me is None:
        return None
    role = dialogue.get("responder_role")
    prompt = system_prompt if system_prompt is not None else str(me.get("system_prompt") or "")
    return group_viewer(
        speaker, prompt, tuple(str(p["participant_id"]) for p in seats),
        responder_role=str(role) if role else None,
        speaker_names="name_field" if me.get("speaker_names") == "name_field" else "prefix",
    )


def event_of(row: Mapping[str, Any]) -> Event:
    """The history event an ``events`` row records (a row as a reader returns it)."""
    kind = row.get("kind")
    if kind not in EVENT_KINDS:
        raise FormatError(f"events.kind is one of {', '.join(EVENT_KINDS)}, not {kind!r}")
    try:
        visible = json.loads(row.get("visible_to") or "[]")
    except json.JSONDecodeError as exc:
        raise FormatError(f"events.visible_to is not JSON: {exc}") from None
    if not isinstance(visible, list) or not all(isinstance(v, str) for v in visible):
        raise FormatError("events.visible_to is a JSON list of participant ids")
    return Event(kind=kind, actor=str(row["actor"]), turn_index=int(row["turn_index"]),
                 visible_to=tuple(visible), call_id=row.get("call_id"), tool=row.get("tool"),
                 arguments=row.get("arguments"), result=row.get("result"),
                 error=row.get("error"), notice=row.get("notice"),
                 world_sha256=row.get("world_sha256"))


def events_by_dialogue(run: Run, only: Collection[str] | None = None) -> dict[str, list[Event]]:
    """Each dialogue's events (of those in ``only``), in ``seq`` order, as history events; empty
    for a run without an events table (export and evaluation read them so)."""
    if not run.has("events"):
        return {}
    frame = run.df("events")
    frame = frame.astype(object).where(frame.notna(), None).sort_values(["dialogue_id", "seq"])
    out: dict[str, list[Event]] = {}
    for record in frame.to_dict("records"):
        row = {str(k): v for k, v in record.items()}
        did = str(row["dialogue_id"])
        if only is None or did in only:
            out.setdefault(did, []).append(event_of(row))
    return out


def seen_messages(
    dialogue: Mapping[str, Any], turns: Sequence[Mapping[str, Any]], index: int,
    participants: Sequence[Mapping[str, Any]] = (), events: Sequence[Mapping[str, Any]] = (),
) -> SeenMessages:
    """Rebuild, byte for byte, the messages the speaker of ``turns[index]`` saw, and check them.

    Harnessed turns (level B and up) store what they saw (it depends on model calls: state,
    context, checker advice); plain turns are re-projected from the history before them. In a
    group dialogue (``participants``: its rows of the participants table) each participant's
    frame and the way it names the others come from its row. In a run with tools
    (``events``: the dialogue's rows of the events table, in ``seq`` order) the history holds
    every event up to the turn's utterance, its own tool calls and results included, so the
    frame that wrote the utterance, tool messages and all, is checked byte for byte;
    :attr:`SeenMessages.steps` are the frames of the turn's tool steps before it.
    """
    turn = turns[index]
    stored = turn.get("messages")
    steps: list[list[Message]] = []
    if isinstance(stored, str) and stored:
        messages: list[Message] = json.loads(stored)
    else:
        history = History()
        for t in turns[:index]:
            history = history.append(t["speaker"], t["text"])
        before = [event_of(e) for e in events if int(e["turn_index"]) < index]
        own = [event_of(e) for e in events if int(e["turn_index"]) == index]
        speaker = turn["speaker"]
        viewer = participant_viewer(dialogue, participants, speaker)
        if viewer is None:
            role = dialogue.get("responder_role")
            prompt = dialogue.get(f"{speaker}_system_prompt") or ""
            viewer = Viewer(speaker, str(prompt), responder_role=str(role) if role else None)
        condition = str(dialogue["condition"])
        history = history.with_events(before)
        # Each step's frame: the events of the turn up to (not including) that step's calls.
        cuts = [i for i, e in enumerate(own) if e.kind == "tool_call"
                and (i == 0 or (own[i - 1].kind != "tool_call" and own[i - 1].kind != "notice"))]
        steps = [project(history.with_events(own[:i]), viewer, condition) for i in cuts]
        messages = project(history.with_events(own), viewer, condition)
    digest = turn.get("messages_sha256")
    verified = None if not digest else messages_digest(messages) == digest
    return SeenMessages(messages, verified, steps)


@dataclass(frozen=True)
class DialogueView:
    """One dialogue with its persona and turns, and what each agent saw at each turn."""

    row: dict[str, Any]
    #: The persona's row, every column as stored (a dict, as this reader has always given:
    #: ``persona_of`` makes a :class:`~spasm.personas.persona.Persona` of it).
    persona: dict[str, Any] | None
    turns: list[dict[str, Any]]
    #: A group dialogue's participants (rows of the participants table), in turn order.
    participants: list[dict[str, Any]] = field(default_factory=list)
    #: A run with tools: the dialogue's events (rows of the events table), in ``seq`` order.
    events: list[dict[str, Any]] = field(default_factory=list)
    #: A run with tools: the world's states (rows of the worlds table), in ``seq`` order.
    worlds: list[dict[str, Any]] = field(default_factory=list)

    def seen(self, turn_index: int) -> SeenMessages:
        """The exact messages the speaker of ``turn_index`` was sent, checked against its digest."""
        return seen_messages(self.row, self.turns, turn_index, self.participants, self.events)


def _committed(table_dir: Path, committed: set[str] | None) -> list[Path]:
    parts = sorted(table_dir.glob("part-*.parquet"))
    if committed is None:
        return parts
    keep = []
    for part in parts:
        batch = part.name[len("part-") : -len(".parquet")]
        if batch in committed or batch.startswith("compacted"):
            keep.append(part)
    return keep


def _conform(table: pa.Table, model: type[Row]) -> pa.Table:
    """Add the columns an older (or imported) table lacks, with their declared defaults."""
    schema = arrow_schema(model)
    for declared in schema:
        if declared.name in table.column_names:
            continue
        info = model.model_fields[declared.name]
        default = None if info.is_required() else info.default
        column = pa.array([default] * table.num_rows, type=declared.type)
        table = table.append_column(declared, column)
    return table


class Run:
    """A run directory opened for reading (see the module docstring)."""

    def __init__(self, path: str | Path, *, verify: bool = True) -> None:
        self.dir = Path(path)
        if self.dir.exists() and not self.dir.is_dir():
            raise UserError(f"{self.dir} is a file, not a run directory; pass the directory that "
                            "`spasm generate` or `spasm import` wrote (e.g. runs/<name>).")
        if not self.dir.is_dir():
            raise UserError(
                f"Run directory {self.dir} does not exist; pass a directory that `spasm generate` "
                "or `spasm import` wrote (e.g. runs/<name>)."
            )
        self._committed: set[str] | None = None
        self._refresh()
        if verify:
            self.verify()

    def verify(self) -> None:
        """Check every committed part's row count and checksum against its commit marker.

        Raises:
            UserError: a part is damaged or missing (naming it; ``spasm generate`` on the same
                run redoes the dialogues it held).
        """
        damage = find_damage(self.dir)
        if damage:
            listed = "; ".join(str(d) for d in damage[:5])
            more = f" and {len(damage) - 5} more" if len(damage) > 5 else ""
            raise UserError(
                f"{self.dir} has damaged parts: {listed}{more}. Rerun `spasm generate` with the "
                "same config and --out to redo what they held (cached calls are replayed), or "
                "restore the run from a backup."
            )

    # -- metadata ---------------------------------------------------------------------------
    def _json(self, name: str) -> dict[str, Any]:
        path = self.dir / name
        if not path.exists():
            return {}
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise UserError(f"{path} is damaged ({exc}); it is not a readable JSON file.") from None
        return data if isinstance(data, dict) else {}

    @cached_property
    def manifest(self) -> dict[str, Any]:
        """manifest.json (empty when absent)."""
        return self._json("manifest.json")

    @cached_property
    def config(self) -> dict[str, Any] | None:
        """The resolved run config of a generated run (``None`` for imported data)."""
        return self._json("config.json").get("config")

    @property
    def schema_version(self) -> str:
        """The format version the run was written with (older runs are read as the current)."""
        return str(self.manifest.get("schema_version") or SCHEMA_VERSION)

    # -- tables -----------------------------------------------------------------------------
    def _files(self, table: str) -> list[Path]:
        path = self.dir / f"{table}.parquet"
        if path.is_file():  # the single-file layout of imports before schema 1.2
            return [path]
        if path.is_dir():
            return _committed(path, self._committed)
        return []

    def files(self, table: str) -> list[Path]:
        """The committed Parquet files of ``table`` (none: ``[]``), for readers that query the
        files themselves (the viewer's DuckDB). Uncommitted parts are never listed."""
        return self._files(table)

    def stored_columns(self, table: str) -> list[str]:
        """The columns the table's files actually hold (before older tables are conformed)."""
        return list(self._dataset(table).schema.names)

    def has(self, table: str) -> bool:
        """Whether the run has the table (possibly empty)."""
        return bool(self._files(table))

    def tables(self) -> list[str]:
        """The tables present in the run directory."""
        return sorted(p.name[: -len(".parquet")] for p in self.dir.glob("*.parquet") if self.has(
            p.name[: -len(".parquet")]))

    def _dataset(self, table: str) -> ds.Dataset:
        files = self._files(table)
        if not files:
            raise UserError(
                f"{self.dir} has no {table} table ({table}.parquet). A run written by "
                "`spasm generate` or `spasm import` has personas, dialogues and turns."
            )
        try:
            return ds.dataset([str(f) for f in files], format="parquet")
        except (OSError, pa.ArrowException) as exc:
            raise UserError(f"Cannot read {self.dir / table}.parquet as Parquet ({exc}).") from None

    def _refresh(self) -> None:
        commits = self.dir / ".commits"
        self._committed = {p.name for p in commits.iterdir()} if commits.is_dir() else None

    def table(self, table: str, columns: list[str] | None = None) -> pa.Table:
        """A whole table as Arrow, conformed to the current schema for the fixed tables."""
        for attempt in range(3):
            dataset = self._dataset(table)
            wanted = None if columns is None else [c for c in columns if c in dataset.schema.names]
            try:
                data = dataset.to_table(columns=wanted)
                break
            except FileNotFoundError:
                if attempt == 2:
                    raise UserError(f"{self.dir} is changing under the reader (parts keep "
                                    "being replaced); read it when the run has finished.") from None
                self._refresh()  # the end-of-run compaction replaced the parts: list them again
            except (OSError, pa.ArrowException) as exc:
                raise UserError(
                    f"Cannot read {self.dir / table}.parquet ({exc}); is a part damaged?") from None
        model = ROW_MODELS.get(table)
        if model is not None:
            data = _conform(data, model)
        return data.select(columns) if columns is not None else data

    def df(self, table: str, columns: list[str] | None = None) -> pd.DataFrame:
        """A whole table as pandas."""
        frame: pd.DataFrame = self.table(table, columns).to_pandas()
        return frame

    def batches(
        self, table: str, *, columns: list[str] | None = None, batch_size: int = 65_536
    ) -> Iterator[pa.RecordBatch]:
        """Iterate a table in record batches (bounded memory however large the run).

        Files are read one after the other with ``ParquetFile.iter_batches``, which holds about
        one row group at a time; pyarrow's dataset scanner reads several ahead (a few hundred
        MiB more on a large run). Columns a file lacks (an older version) are left out of its
        batches, not filled."""
        files = self._files(table)
        if not files:
            self._dataset(table)  # raises the "no such table" UserError
        for path in files:
            try:
                parquet = pq.ParquetFile(path)
                names = parquet.schema_arrow.names
                wanted = None if columns is None else [c for c in columns if c in names]
                yield from parquet.iter_batches(batch_size=batch_size, columns=wanted)
            except FileNotFoundError:
                raise UserError(f"{self.dir} is changing under the reader (a part was replaced); "
                                "read it when the run has finished.") from None
            except (OSError, pa.ArrowException) as exc:
                raise UserError(f"Cannot read {path} ({exc}); is a part damaged?") from None

    @property
    def personas(self) -> pd.DataFrame:
        return self.df("personas")

    @property
    def dialogues(self) -> pd.DataFrame:
        return self.df("dialogues")

    @property
    def turns(self) -> pd.DataFrame:
        return self.df("turns")

    @property
    def calls(self) -> pd.DataFrame:
        return self.df("calls")

    # -- one dialogue -----------------------------------------------------------------------
    def dialogue(self, dialogue_id: str) -> DialogueView:
        """One dialogue: its row, its persona, its turns in order, and what each agent saw."""
        rows = self._dataset("dialogues").to_table(filter=pc.field("dialogue_id") == dialogue_id)
        if rows.num_rows == 0:
            raise UserError(f"{self.dir} has no dialogue {dialogue_id!r}.")
        row = _conform(rows.slice(0, 1), ROW_MODELS["dialogues"]).to_pylist()[0]
        turns = _conform(
            self._dataset("turns").to_table(filter=pc.field("dialogue_id") == dialogue_id),
            ROW_MODELS["turns"],
        ).sort_by("turn_index").to_pylist()
        persona = None
        if self.has("personas"):
            found = self._dataset("personas").to_table(
                filter=pc.field("persona_id") == str(row["persona_id"])
            )
            persona = persona_row(found.to_pylist()[0]) if found.num_rows else None
        participants: list[dict[str, Any]] = []
        if self.has("participants"):
            participants = self._dataset("participants").to_table(
                filter=pc.field("dialogue_id") == dialogue_id).sort_by("position").to_pylist()
        tables = {}
        for name in ("events", "worlds"):
            tables[name] = (self._dataset(name).to_table(
                filter=pc.field("dialogue_id") == dialogue_id).sort_by("seq").to_pylist()
                if self.has(name) else [])
        return DialogueView(row, persona, turns, participants, tables["events"], tables["worlds"])


def open_run(path: str | Path, *, verify: bool = True) -> Run:
    """Open a run directory for reading; ``verify`` checks every committed part first."""
    return Run(path, verify=verify)
