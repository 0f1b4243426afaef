"""Reading a run directory's tables for evaluation (through :func:`spasm.dataset.open_run`).

Only dialogues with ``status == "ok"`` are evaluated; extra columns are ignored, missing
optional ones are filled, and a missing required table or column is a :class:`UserError`
that says what to do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from spasm.dataset.reader import Run, open_run
from spasm.errors import UserError

__all__ = ["Conversation", "RunData", "load_run"]

_REQUIRED: dict[str, tuple[str, ...]] = {
    "dialogues": ("dialogue_id", "persona_id"),
    "turns": ("dialogue_id", "turn_index", "speaker", "text"),
    "personas": ("persona_id",),
}
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

    def persona_rows(self) -> dict[str, dict[str, object]]:
        """Persona fields by persona id."""
        records = self.personas.drop_duplicates("persona_id").to_dict("records")
        return {str(r["persona_id"]): {str(k): v for k, v in r.items()} for r in records}


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
    dialogues = dialogues.sort_values(["pairing", "condition", "persona_id", "conversation_index"])
    dialogues = dialogues.reset_index(drop=True)

    personas = personas.copy()
    personas["persona_id"] = personas["persona_id"].astype(str)

    turns = turns.copy()
    turns["dialogue_id"] = turns["dialogue_id"].astype(str)
    turns["speaker"] = turns["speaker"].astype(str).str.lower()
    turns["text"] = turns["text"].fillna("").astype(str)
    turns = turns[turns["dialogue_id"].isin(set(dialogues["dialogue_id"]))]
    turns = turns.sort_values(["dialogue_id", "turn_index"], kind="stable").reset_index(drop=True)

    data = RunData(run_dir, personas, dialogues, turns, n_total)
    by_dialogue = {str(k): g for k, g in turns.groupby("dialogue_id", sort=False)}
    conversations: list[Conversation] = []
    for row in dialogues.to_dict("records"):
        group = by_dialogue.get(str(row["dialogue_id"]))
        if group is None or group.empty:
            continue
        conversations.append(
            Conversation(
                dialogue_id=str(row["dialogue_id"]),
                persona_id=str(row["persona_id"]),
                conversation_index=int(row["conversation_index"]),
                condition=str(row["condition"]),
                pairing=str(row["pairing"]),
                harness_level=str(row["harness_level"]),
                speakers=tuple(group["speaker"].tolist()),
                texts=tuple(group["text"].tolist()),
                seed=None if pd.isna(row.get("seed")) else int(row["seed"]),
                scenario_id=None if pd.isna(row.get("scenario_id")) else str(row["scenario_id"]),
                goal_met=None if pd.isna(row.get("goal_met")) else bool(row["goal_met"]),
            )
        )
    data.conversations = conversations
    return data
