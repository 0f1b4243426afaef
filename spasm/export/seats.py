"""The seats of a group run's dialogues, as export and QA need them (format 1.7's
``participants`` table: one row per participant of each dialogue, in turn order).

A two-party run has no such table: :func:`group_seats` gives ``{}`` and every caller takes its
two-party path. ``--role`` on a group run names a role (every seat of it) or one
participant id (:func:`wanted_seats`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from spasm.dataset import Run
from spasm.errors import UserError

__all__ = ["ROLE_WORDS", "SEAT_COLUMNS", "check_role", "group_seats", "participant_ids", "select_role",
           "speaker_tokens", "wanted_seats"]

#: What ``--role`` names besides a participant id.
ROLE_WORDS = ("responder", "client", "both")
#: The participants columns an export reads.
SEAT_COLUMNS = ["dialogue_id", "position", "participant_id", "role", "persona_id", "speaker_names",
                "system_prompt"]


def group_seats(run: Run, only: Iterable[str] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Each group dialogue's seats (rows of :data:`SEAT_COLUMNS`) in turn order, for the
    dialogues in ``only`` (default: all); ``{}`` for a two-party run.

    Raises:
        UserError: a row has no dialogue or participant id (the table is not a group run's).
    """
    if not run.has("participants"):
        return {}
    table = run.table("participants", SEAT_COLUMNS)
    if only is not None:
        table = table.filter(pc.is_in(table.column("dialogue_id"),
                                      value_set=pa.array(sorted(set(only)), pa.string())))
    out: dict[str, list[dict[str, Any]]] = {}
    for n, row in enumerate(table.to_pylist()):
        if not row["dialogue_id"] or not row["participant_id"]:
            raise UserError(f"{run.dir / 'participants.parquet'}: row {n + 1} has no dialogue_id or "
                            "participant_id; a group run's participants table names both in every row")
        out.setdefault(str(row["dialogue_id"]), []).append(row)
    for seats in out.values():
        seats.sort(key=lambda r: int(r["position"] if r["position"] is not None else 0))
    return out


def participant_ids(seats: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Every participant id of the run, in seat order of first appearance."""
    return list(dict.fromkeys(str(s["participant_id"]) for d in seats.values() for s in d))


def check_role(role: str, seats: dict[str, list[dict[str, Any]]], run: Run) -> None:
    """``--role`` must name a role, or a participant of this group run.

    Raises:
        UserError: a participant id on a two-party run, or one no seat of this run has.
    """
    if role in ROLE_WORDS:
        return
    if not seats:
        raise UserError(f"--role {role!r}: {run.dir} is a two-party run (no participants table); "
                        f"choose {', '.join(ROLE_WORDS)}")
    ids = participant_ids(seats)
    if role not in ids:
        raise UserError(f"--role {role!r} is no participant of {run.dir}; choose a participant id "
                        f"({', '.join(ids)}) or a role ({', '.join(ROLE_WORDS)})")


def wanted_seats(role: str, seats: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The seats of one dialogue that ``--role`` exports: that participant's, every seat of
    the role, or every seat (``both``)."""
    if role == "both":
        return list(seats)
    if role in ROLE_WORDS:
        return [s for s in seats if s["role"] == role]
    return [s for s in seats if s["participant_id"] == role]


def speaker_tokens(seats: list[dict[str, Any]], speakers: set[str]) -> set[str]:
    """What a group dialogue offers :func:`spasm.export.select.select` to check that it has a
    turn to train on: the roles of the seats that spoke and, as ``@id``, their ids (so that an
    id never reads as a role; :func:`select_role` is what ``--role`` asks of them)."""
    spoke = [s for s in seats if s["participant_id"] in speakers]
    return {*(str(s["role"]) for s in spoke), *(f"@{s['participant_id']}" for s in spoke)}


def select_role(role: str) -> str:
    """``--role`` as :func:`speaker_tokens` spell it (a participant id as ``@id``)."""
    return role if role in ROLE_WORDS else f"@{role}"
