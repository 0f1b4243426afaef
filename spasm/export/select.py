"""Which dialogues an export keeps, and why each other one was dropped.

By default an export drops the dialogues that failed (status other than ``ok``, or ended by an
``error``), those with a QA finding that cannot be redacted (AI-identity or prompt leakage,
empty turns, broken alternation, a duplicate of an earlier dialogue, an utterance in another
language than the persona's) and those ``spasm eval``
or an annotator marked as echoing (a role flip). Quarantined dialogues never reached the
dialogues table; they are counted apart. Filters narrow the rest. Every dropped dialogue is
counted under the first reason that applies, in the order of :data:`REASONS`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from spasm.errors import UserError
from spasm.export.qa import DIALOGUE_KINDS, QAResult
from spasm.export.scans import REDACTABLE, scan_names

__all__ = ["DIALOGUE_COLUMNS", "REASONS", "Selection", "SelectionResult", "check_selection", "qa_kinds",
           "select"]

#: The dialogue columns selection and the examples' metadata need.
DIALOGUE_COLUMNS = ["dialogue_id", "persona_id", "conversation_index", "condition", "pairing",
                    "client_model", "responder_model", "harness_level", "termination_reason",
                    "n_utterances", "status", "client_system_prompt", "responder_system_prompt"]
#: Unredactable QA kinds in the order a dropped dialogue is attributed to them.
_QA_ORDER = ("duplicate", "near_duplicate", "ai_identity", "prompt_leak", "harness_notes", "empty_turn",
             "alternation", "off_language")
REASONS = ("failed", "human", "condition", "pairing", "harness_level", "termination_reason", "min_utterances",
           "max_utterances", "echoing", *(f"qa:{k}" for k in _QA_ORDER), "only_qa", "no_turn_of_role")
_FILTERS = {"condition": "conditions", "pairing": "pairings", "harness_level": "harness_levels",
            "termination_reason": "terminations"}


#: The reasons a dialogue with a person in it is dropped under ``human`` instead (all but failed).
_AFTER_HUMAN = (None, *REASONS[2:])


def qa_kinds() -> list[str]:
    """Every kind of QA finding."""
    return sorted(set(scan_names()) | set(DIALOGUE_KINDS))


class Selection(BaseModel):
    """The selection options of ``spasm export``."""

    model_config = ConfigDict(extra="forbid")

    conditions: list[str] = []
    pairings: list[str] = []
    harness_levels: list[str] = []
    terminations: list[str] = []
    min_utterances: int | None = Field(None, ge=0)
    max_utterances: int | None = Field(None, ge=0)
    #: Finding kinds that do not drop a dialogue (``role_flip`` here is ``echoing="keep"``).
    allow_qa: list[str] = []
    #: Keep only dialogues with a finding of one of these kinds (they are allowed too).
    only_qa: list[str] = []
    echoing: Literal["drop", "keep", "only"] = "drop"
    #: Keep dialogues that failed (status other than ok).
    include_failed: bool = False
    #: Keep dialogues with a person in a seat (``spasm play``, imports): their turns were
    #: typed by people, so they are training data only when asked for (``--include-human``).
    include_human: bool = False

    def check_kinds(self) -> None:
        """Unknown finding kinds are a :class:`UserError`."""
        known = set(qa_kinds())
        for flag, kinds in (("--allow-qa", self.allow_qa), ("--only-qa", self.only_qa)):
            bad = sorted(set(kinds) - known)
            if bad:
                raise UserError(f"{flag}: unknown finding kind(s) {', '.join(bad)}; "
                                f"known: {', '.join(sorted(known))}")


@dataclass
class SelectionResult:
    """The kept dialogue ids (in table order) and the count of dropped ones by reason."""

    kept: list[str]
    dropped: dict[str, int] = field(default_factory=dict)
    #: Dialogues quarantined with an error that never completed.
    quarantined: int = 0
    considered: int = 0


def _check_values(table: pa.Table, column: str, wanted: list[str]) -> None:
    present = set(table.column(column).to_pylist())
    missing = sorted(set(wanted) - present)
    if missing:
        flag = "--" + column.replace("_", "-").replace("-reason", "")
        raise UserError(f"{flag} {', '.join(missing)} matches no dialogue of this run; present: "
                        f"{', '.join(sorted(str(p) for p in present))}")


def check_selection(dialogues: pa.Table, selection: Selection) -> None:
    """Unknown finding kinds, and filter values no dialogue has, are a :class:`UserError`."""
    selection.check_kinds()
    for column, attr in _FILTERS.items():
        _check_values(dialogues, column, getattr(selection, attr))
    low, high = selection.min_utterances, selection.max_utterances
    if low is not None and high is not None and low > high:
        raise UserError(f"--min-utterances {low} is above --max-utterances {high}")


def _reason(row: dict[str, object], s: Selection, kinds: set[str], flipped: bool) -> str | None:
    if not s.include_failed and (row["status"] != "ok" or row["termination_reason"] == "error"):
        return "failed"
    for column, attr in _FILTERS.items():
        wanted = getattr(s, attr)
        if wanted and row[column] not in wanted:
            return column
    n = int(row["n_utterances"] or 0)  # type: ignore[call-overload]
    if s.min_utterances is not None and n < s.min_utterances:
        return "min_utterances"
    if s.max_utterances is not None and n > s.max_utterances:
        return "max_utterances"
    allowed = set(s.allow_qa) | set(s.only_qa)
    drop_flip = s.echoing == "drop" and flipped and "role_flip" not in allowed
    if drop_flip or (s.echoing == "only" and not flipped):
        return "echoing"
    for kind in _QA_ORDER:
        if kind in kinds and kind not in allowed:
            return f"qa:{kind}"
    if s.only_qa and not kinds & set(s.only_qa):
        return "only_qa"
    return None


def select(
    dialogues: pa.Table,
    qa: QAResult,
    selection: Selection,
    errors: Iterable[str] = (),
    *,
    speakers: Mapping[str, set[str]] | None = None,
    role: str = "responder",
    people: Collection[str] = (),
) -> SelectionResult:
    """Apply ``selection`` to the dialogues table (``DIALOGUE_COLUMNS``). With ``speakers``
    (who speaks in each dialogue), a dialogue without a turn of the exported ``role`` (each
    role for ``both``) is dropped too: it would make an example with nothing to train on.
    ``people``: the dialogues with a person in a seat, dropped (``human``) unless
    ``include_human``."""
    needed = {"client", "responder"} if role == "both" else {role}
    check_selection(dialogues, selection)
    if selection.echoing == "only" and not qa.summary.role_flips.startswith(("spasm eval", "annotations")):
        raise UserError("--echoing only needs echoing signals: run `spasm eval RUN_DIR` (or annotate "
                        "the run in `spasm view`) first")
    by_kind: dict[str, set[str]] = {}
    for r in qa.rows:
        if r.kind not in REDACTABLE:
            by_kind.setdefault(r.dialogue_id, set()).add(r.kind)
    kept: list[str] = []
    dropped: Counter[str] = Counter()
    columns = [c for c in ("dialogue_id", "status", "termination_reason", "n_utterances", *_FILTERS)]
    data = {c: dialogues.column(c).to_pylist() for c in columns}
    for i, did in enumerate(data["dialogue_id"]):
        row = {c: data[c][i] for c in columns}
        kinds = by_kind.get(did, set())
        reason = _reason(row, selection, kinds - {"role_flip"}, "role_flip" in kinds)
        if reason in _AFTER_HUMAN and did in people and not selection.include_human:
            reason = "human"
        if reason is None and speakers is not None and not needed <= speakers.get(did, set()):
            reason = "no_turn_of_role"
        if reason is None:
            kept.append(did)
        else:
            dropped[reason] += 1
    done = set(data["dialogue_id"])
    quarantined = len({e for e in errors if e not in done})
    ordered = {r: dropped[r] for r in REASONS if dropped[r]}
    return SelectionResult(kept, ordered, quarantined, len(done))
