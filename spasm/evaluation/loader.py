"""Reading a run directory's tables for evaluation (through :func:`spasm.dataset.open_run`).

Only dialogues with ``status == "ok"`` are evaluated; extra columns are ignored, missing
optional ones are filled, and a missing required table or column is a :class:`UserError`
that says what to do. Each personas row is read as a
:class:`~spasm.personas.persona.Persona` (:attr:`RunData.by_id`).

A group dialogue (a dialogue with rows in a group run's ``participants`` table) keeps its
speakers as participant ids and also carries each utterance's side (``turns.role``, else its
seat's role) and its seat's persona, so the per-side metrics can count every client seat as
the client side (docs/evaluation.md, "Group dialogues").
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from spasm.dataset.persona_rows import persona_of
from spasm.dataset.reader import Run, open_run
from spasm.errors import FormatError, UserError
from spasm.personas.persona import Persona
from spasm.registry import condition_rank

__all__ = [
    "Conversation",
    "GroupDialogue",
    "Participant",
    "RunData",
    "clean_cell",
    "condition_groups",
    "has_participants",
    "load_group_dialogues",
    "load_reference",
    "load_run",
    "reference_paths",
    "seat_role",
]

_REQUIRED: dict[str, tuple[str, ...]] = {
    "dialogues": ("dialogue_id", "persona_id"),
    "turns": ("dialogue_id", "turn_index", "speaker", "text"),
    "personas": ("persona_id",),
}
#: The columns a group run's participants table needs at least.
_PARTICIPANT_COLUMNS = ("dialogue_id", "participant_id")
# Optional dialogue columns and the value used when a dataset lacks them.
_DIALOGUE_DEFAULTS: dict[str, object] = {
    "conversation_index": 0,
    "condition": "ecp",
    "harness_level": "",
    "pairing": "unknown",
    "status": "ok",
    "termination_reason": "",
}


@dataclass(frozen=True)
class Conversation:
    """One dialogue, ready for the metrics: its utterances in order, with speakers."""

    dialogue_id: str
    persona_id: str
    conversation_index: int
    condition: str
    pairing: str
    harness_level: str
    speakers: tuple[str, ...]
    texts: tuple[str, ...]
    #: The dialogue's generation seed (``None`` when the dataset has no seed column).
    seed: int | None = None
    #: A run with scenarios: the dialogue's scenario and the goal judge's decision.
    scenario_id: str | None = None
    goal_met: bool | None = None
    #: A run with trials: the dialogue's trial (0..K-1); ``None`` in a run without trials.
    trial: int | None = None
    #: A run with rewards (tool scenarios): the dialogue's reward in [0, 1]; ``None`` without.
    reward: float | None = None
    #: A group dialogue: each utterance's side (``client`` or ``responder``, from ``turns.role``
    #: or its seat's role; ``speakers`` then holds participant ids). ``None``: a two-party
    #: dialogue, whose speakers are its sides.
    roles: tuple[str, ...] | None = None
    #: A group dialogue: the persona id of each utterance's seat (``None``: a seat without one).
    seat_personas: tuple[str | None, ...] | None = None

    @property
    def is_group(self) -> bool:
        """Whether this is a group dialogue (it has participants)."""
        return self.roles is not None

    @property
    def sides(self) -> tuple[str, ...]:
        """Each utterance's side: its role in a group dialogue, else its speaker."""
        return self.speakers if self.roles is None else self.roles

    @property
    def outcome(self) -> bool | None:
        """Whether the dialogue succeeded: its reward when the run has one (a reward of 1, as
        τ² counts success), else the goal judge's ``goal_met``; ``None``: undecided."""
        if self.reward is not None:
            return self.reward >= 1.0 - 1e-6
        return self.goal_met

    def side(self, speaker: str) -> list[str]:
        """The utterances of one speaker, in order."""
        return [t for s, t in zip(self.speakers, self.texts, strict=True) if s == speaker]


@dataclass
class RunData:
    """The evaluable part of a run: personas, ok dialogues and their turns."""

    run_dir: Path
    personas: pd.DataFrame
    dialogues: pd.DataFrame
    turns: pd.DataFrame
    n_dialogues_total: int
    conversations: list[Conversation] = field(default_factory=list)
    #: Each persona by its id (the first row of an id that repeats), read by
    #: :func:`~spasm.dataset.persona_rows.persona_of`; a persona whose table has no card (one
    #: another tool wrote, which may hold only ``persona_id``) has the card ``""``.
    by_id: dict[str, Persona] = field(default_factory=dict)


def clean_cell(value: object) -> str | None:
    """A table cell as text: ``None`` for a null, NaN or blank cell, else its stripped string."""
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return None
    text = str(value).strip()
    return text or None


def condition_groups(
    convs: Sequence[Conversation],
) -> list[tuple[tuple[str, str], list[Conversation]]]:
    """The conversations by ``(pairing, condition)``: ``("all", "all")`` first, then each
    condition over ``all`` pairings, then (only with several pairings) each pairing × condition,
    conditions in their registry order."""
    groups: dict[tuple[str, str], list[Conversation]] = defaultdict(list)
    pairings = {c.pairing for c in convs}
    for c in convs:
        groups[("all", "all")].append(c)
        groups[("all", c.condition)].append(c)
        if len(pairings) > 1:
            groups[(c.pairing, c.condition)].append(c)
    order = sorted(groups, key=lambda k: (k[1] != "all", k[0] != "all", k[0],
                                          *condition_rank(k[1])))
    return [(key, groups[key]) for key in order]


def seat_role(role: object, persona_id: str | None) -> str:
    """A seat's side: its stored role, else ``client`` when it holds a persona, else ``responder``."""
    return (clean_cell(role) or ("client" if persona_id else "responder")).lower()


#: A dialogue's seats: participant id (lower case, as speakers are read) -> (id as stored, role, persona).
_Seats = dict[str, tuple[str, str, str | None]]


def _seats(run: Run, wanted: set[str]) -> dict[str, _Seats]:
    """The seats of every group dialogue among ``wanted`` (none for a two-party run, or a
    participants table without ids: the group stage reports that one)."""
    if not run.has("participants"):
        return {}
    stored = run.stored_columns("participants")
    if not set(_PARTICIPANT_COLUMNS) <= set(stored):
        return {}
    columns: list[str] = [c for c in ("dialogue_id", "participant_id", "role", "persona_id") if c in stored]
    out: dict[str, _Seats] = {}
    for r in run.df("participants", columns).to_dict("records"):
        did, pid = clean_cell(r.get("dialogue_id")), clean_cell(r.get("participant_id"))
        if did is None or pid is None or did not in wanted:
            continue
        persona = clean_cell(r.get("persona_id"))
        out.setdefault(did, {})[pid.lower()] = (pid, seat_role(r.get("role"), persona), persona)
    return out


def _group_fields(group: pd.DataFrame, seats: _Seats) -> dict[str, tuple[Any, ...]]:
    """A group dialogue's speakers (participant ids as stored), roles and seat personas."""
    stored = group["role"].tolist() if "role" in group.columns else [None] * len(group)
    speakers, roles, personas = [], [], []
    for speaker, role in zip(group["speaker"].tolist(), stored, strict=True):
        pid, seat_side, persona = seats.get(speaker, (speaker, "", None))
        speakers.append(pid)
        roles.append((clean_cell(role) or seat_side).lower())
        personas.append(persona)
    return {"speakers": tuple(speakers), "roles": tuple(roles), "seat_personas": tuple(personas)}


def _read_table(run: Run, name: str) -> pd.DataFrame:
    if not run.has(name):
        raise UserError(
            f"{run.dir / (name + '.parquet')} does not exist. `spasm eval` needs a run directory "
            "with personas.parquet, dialogues.parquet and turns.parquet (written by "
            "`spasm generate`, or by `spasm import` from a JSONL dataset)."
        )
    stored = run.stored_columns(name)
    missing = [c for c in _REQUIRED[name] if c not in stored]
    if missing:
        raise UserError(
            f"{run.dir / (name + '.parquet')} lacks the column(s) {', '.join(missing)}; it needs "
            f"at least {', '.join(_REQUIRED[name])}."
        )
    return run.df(name)


def _personas_by_id(path: Path, personas: pd.DataFrame) -> dict[str, Persona]:
    """Each persona of the table (its ``persona_id`` as text) by id, the first row of an id
    that repeats; a row without ``persona_index`` stands at its place among them."""
    out: dict[str, Persona] = {}
    for place, record in enumerate(personas.drop_duplicates("persona_id").to_dict("records")):
        try:
            persona = persona_of(record, place=place, card="")
        except FormatError as exc:
            raise UserError(f"{path}: {exc}; fix the table or leave the column out.") from None
        out[persona.id] = persona
    return out


def load_reference(path: str | Path) -> list[RunData]:
    """A reference's runs: ``path`` itself when it is a run, else the runs in its folders one
    or two levels down (``runs/`` of several ``spasm play --out`` sessions, or a viewer's
    ``RUN.play/<session>/run``), in name order.

    Raises:
        UserError: ``path`` is neither a run nor holds one (the run's own error), or one of
            the runs in it cannot be read (named).
    """
    return [load_run(p) for p in reference_paths(path)]


def reference_paths(path: str | Path) -> list[Path]:
    """The run directories :func:`load_reference` reads (``path`` itself when it is a run or
    holds none, so that loading it says what a run needs)."""
    root = Path(path)
    if (root / "dialogues.parquet").exists() or not root.is_dir():
        return [root]
    found = sorted({p for p in [*root.glob("*"), *root.glob("*/run")]
                    if p.is_dir() and (p / "dialogues.parquet").exists()})
    return found or [root]


def load_run(run_dir: str | Path) -> RunData:
    """Load and clean a run directory's tables.

    Raises:
        UserError: the directory, a table or a required column is missing.
    """
    run = open_run(run_dir)
    run_dir = run.dir
    personas = _read_table(run, "personas")
    dialogues = _read_table(run, "dialogues")
    turns = _read_table(run, "turns")
    n_total = len(dialogues)

    dialogues = dialogues.copy()
    for column, default in _DIALOGUE_DEFAULTS.items():
        if column not in dialogues.columns:
            dialogues[column] = pd.Series([default] * len(dialogues), index=dialogues.index)
        else:
            dialogues[column] = dialogues[column].where(dialogues[column].notna(), default)
    for column in ("dialogue_id", "persona_id", "condition", "pairing", "harness_level", "status"):
        dialogues[column] = dialogues[column].fillna("").astype(str)
    dialogues["conversation_index"] = (
        pd.to_numeric(dialogues["conversation_index"], errors="coerce").fillna(0).astype(int)
    )
    if "seed" in dialogues.columns:
        dialogues["seed"] = pd.to_numeric(dialogues["seed"], errors="coerce").astype("Int64")
    dialogues["condition"] = dialogues["condition"].str.lower()
    dialogues = dialogues[dialogues["status"] == "ok"].drop_duplicates("dialogue_id")
    order = ["pairing", "condition", "persona_id", "conversation_index"]
    if "trial" in dialogues.columns and dialogues["trial"].notna().any():
        order.append("trial")  # a run with trials: each dialogue's trials in order
    dialogues = dialogues.sort_values(order)
    dialogues = dialogues.reset_index(drop=True)

    personas = personas.copy()
    personas["persona_id"] = personas["persona_id"].astype(str)

    turns = turns.copy()
    turns["dialogue_id"] = turns["dialogue_id"].astype(str)
    turns["speaker"] = turns["speaker"].astype(str).str.lower()
    turns["text"] = turns["text"].fillna("").astype(str)
    turns = turns[turns["dialogue_id"].isin(set(dialogues["dialogue_id"]))]
    turns = turns.sort_values(["dialogue_id", "turn_index"], kind="stable").reset_index(drop=True)

    data = RunData(run_dir, personas, dialogues, turns, n_total,
                   by_id=_personas_by_id(run.dir / "personas.parquet", personas))
    by_dialogue = {str(k): g for k, g in turns.groupby("dialogue_id", sort=False)}
    seats = _seats(run, set(dialogues["dialogue_id"]))
    conversations: list[Conversation] = []
    for row in dialogues.to_dict("records"):
        group = by_dialogue.get(str(row["dialogue_id"]))
        if group is None or group.empty:
            continue
        members = seats.get(str(row["dialogue_id"]))
        fields = _group_fields(group, members) if members else {"speakers": tuple(group["speaker"].tolist())}
        conversations.append(
            Conversation(
                dialogue_id=str(row["dialogue_id"]),
                persona_id=str(row["persona_id"]),
                conversation_index=int(row["conversation_index"]),
                condition=str(row["condition"]),
                pairing=str(row["pairing"]),
                harness_level=str(row["harness_level"]),
                texts=tuple(group["text"].tolist()),
                seed=None if pd.isna(row.get("seed")) else int(row["seed"]),
                scenario_id=None if pd.isna(row.get("scenario_id")) else str(row["scenario_id"]),
                goal_met=None if pd.isna(row.get("goal_met")) else bool(row["goal_met"]),
                trial=None if pd.isna(row.get("trial")) else int(row["trial"]),
                reward=None if pd.isna(row.get("reward")) else float(row["reward"]),
                **fields,
            )
        )
    data.conversations = conversations
    return data


# The participants of group dialogues, as the group stage reads them (with their seats'
# positions, backends, models and levels, and the speakers in the case the turns store).


@dataclass(frozen=True)
class Participant:
    """One seat of a group dialogue (a row of the ``participants`` table)."""

    participant_id: str
    position: int
    role: str
    persona_id: str | None = None
    backend: str | None = None
    model: str | None = None
    level: str | None = None


@dataclass(frozen=True)
class GroupDialogue:
    """One group dialogue: its participants in order and its utterances (speaker = participant id)."""

    dialogue_id: str
    condition: str
    pairing: str
    participants: tuple[Participant, ...]
    speakers: tuple[str, ...]
    texts: tuple[str, ...]

    @property
    def ids(self) -> list[str]:
        """The participant ids in seat order."""
        return [p.participant_id for p in self.participants]

    def participant(self, participant_id: str) -> Participant | None:
        return next((p for p in self.participants if p.participant_id == participant_id), None)

    @property
    def persona_set(self) -> str:
        """The client seats' persona ids, sorted and joined with ``+`` (the pairing key of twins)."""
        ids = sorted(p.persona_id for p in self.participants if p.role == "client" and p.persona_id)
        return "+".join(ids)


def has_participants(run_dir: str | Path | Run) -> bool:
    """Whether the run is a group run (it has a ``participants`` table)."""
    run = run_dir if isinstance(run_dir, Run) else open_run(run_dir, verify=False)
    return run.has("participants")


def load_group_dialogues(run_dir: str | Path | Run,
                         conversations: Sequence[Conversation]) -> list[GroupDialogue] | None:
    """The group dialogues among ``conversations`` (the ok dialogues :func:`load_run` read),
    their speakers as stored (participant ids), or ``None`` for a run without participants.

    A dialogue without participant rows is not a group dialogue and is left out.

    Raises:
        UserError: the participants table lacks ``dialogue_id`` or ``participant_id``.
    """
    run = run_dir if isinstance(run_dir, Run) else open_run(run_dir, verify=False)
    if not run.has("participants"):
        return None
    stored = run.stored_columns("participants")
    missing = [c for c in _PARTICIPANT_COLUMNS if c not in stored]
    if missing:
        raise UserError(
            f"{run.dir / 'participants.parquet'} lacks the column(s) {', '.join(missing)}; a group "
            "run's participants table needs at least dialogue_id and participant_id."
        )
    table = run.df("participants")
    wanted = {c.dialogue_id for c in conversations}
    seats: dict[str, list[Participant]] = defaultdict(list)
    for n, r in enumerate(table.to_dict("records")):
        did, pid = clean_cell(r.get("dialogue_id")), clean_cell(r.get("participant_id"))
        if did is None or pid is None or did not in wanted:
            continue
        position = pd.to_numeric(pd.Series([r.get("position")]), errors="coerce").iloc[0]
        persona = clean_cell(r.get("persona_id"))
        role = seat_role(r.get("role"), persona)
        seats[did].append(Participant(pid, int(position) if pd.notna(position) else n, role, persona,
                                      clean_cell(r.get("backend")), clean_cell(r.get("model")),
                                      clean_cell(r.get("level"))))
    turns = run.df("turns", ["dialogue_id", "turn_index", "speaker", "text"])
    turns = turns[turns["dialogue_id"].astype(str).isin(seats)].copy()
    turns["dialogue_id"] = turns["dialogue_id"].astype(str)
    turns["speaker"] = turns["speaker"].fillna("").astype(str)
    turns["text"] = turns["text"].fillna("").astype(str)
    turns = turns.sort_values(["dialogue_id", "turn_index"], kind="stable")
    by_dialogue = {str(k): g for k, g in turns.groupby("dialogue_id", sort=False)}
    out = []
    for conv in conversations:
        members = seats.get(conv.dialogue_id)
        group = by_dialogue.get(conv.dialogue_id)
        if not members or group is None:
            continue
        members = sorted({p.participant_id: p for p in members}.values(), key=lambda p: p.position)
        canonical = {p.participant_id.lower(): p.participant_id for p in members}
        speakers = tuple(canonical.get(s.lower(), s) for s in group["speaker"].tolist())
        out.append(GroupDialogue(conv.dialogue_id, conv.condition, conv.pairing, tuple(members),
                                 speakers, tuple(group["text"].tolist())))
    return out
