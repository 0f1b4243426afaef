"""People in seats: the human record of a run with a ``kind: human`` seat (format 1.10).

A run with a human seat stores each seat's kind (``llm``, ``function``, ``human``) in its
dialogues (two-party: ``client_kind``, ``responder_kind``) and participants (``kind``) rows, the
human seat's pseudonymous ``operator`` and ``interface``, and with each of the person's turns the
typing its interface measured (``typing_ms``, ``edits``, ``pasted_chars``). Its pairing label
names the person: ``human×<model>``. A run without a human seat has none of these
columns (:func:`has_people` is false, nothing here runs; tests/golden pins its bytes).

The runner calls :func:`record_people` on a finished dialogue's rows; the typing comes from the
human backend, which keeps each reply's measurements until they are taken
(:meth:`spasm.backends.human.HumanBackend.take`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, TypeVar, cast

from spasm.backends.human import HumanBackend, PersonReply
from spasm.calls import Caller
from spasm.config import PairingConfig, RunConfig
from spasm.dataset.rows import (
    DialogueRow,
    ErrorRow,
    ParticipantRow,
    Row,
    TurnRow,
    human_row_model,
)

__all__ = ["has_people", "pairing_label", "record_people", "seat_kind"]

#: A backend kind -> the kind of seat it fills (anything else is a model: ``llm``).
_KINDS = {"human": "human", "python": "function"}


def seat_kind(config: RunConfig, backend: str) -> str:
    """``llm``, ``function`` or ``human``: who fills a seat played by ``backend``."""
    return _KINDS.get(config.backends[backend].kind, "llm")


def has_people(config: RunConfig) -> bool:
    """Whether the run has a backend a person answers for (its tables get the 1.10 columns)."""
    return any(b.kind == "human" for b in config.backends.values())


def pairing_label(config: RunConfig, sides: tuple[str, str]) -> str:
    """The ``pairing`` column for a dialogue row's client and responder backends (``sides``):
    with a person in it ``human×<model>`` (the client's side first); a pairing of models keeps
    its label (``client/responder``)."""
    if not any(seat_kind(config, b) == "human" for b in sides):
        return PairingConfig.label_of(*sides)
    return "×".join("human" if seat_kind(config, b) == "human" else config.backends[b].model
                    for b in sides)


class _Result(Protocol):
    """The rows of one finished dialogue (:class:`spasm.runner.DialogueResult`)."""

    dialogue: DialogueRow | None
    turns: list[TurnRow]
    error: ErrorRow | None
    participants: list[ParticipantRow]


R = TypeVar("R", bound=Row)


def _widen(row: R, **values: Any) -> R:
    """``row`` as its model with the human-seat columns (a subclass of its own model)."""
    return cast(R, human_row_model(type(row)).model_validate({**row.as_record(), **values}))


def _person(config: RunConfig, backends: list[str]) -> dict[str, Any]:
    """The first human seat's operator and interface among ``backends``."""
    for b in backends:
        cfg = config.backends[b]
        if cfg.kind == "human":
            return {"operator": cfg.operator or "anonymous", "interface": cfg.interface or "terminal"}
    return {"operator": None, "interface": None}


def _typing(reply: PersonReply | None) -> dict[str, Any]:
    if reply is None:
        return {}
    return {"typing_ms": reply.typing_ms, "edits": reply.edits, "pasted_chars": reply.pasted_chars}


async def record_people(
    result: _Result, config: RunConfig, caller: Caller, dialogue_id: str, sides: tuple[str, str],
    seat_backends: Mapping[str, str], goal: str | None = None,
) -> None:
    """Widen one dialogue's rows with the human-seat columns, in place: the seats' kinds, the
    person's operator and interface, each human turn's typing and the human pairing label.
    ``sides``: the client and responder backends the dialogue row names (a group's first
    client and first responder seats'). ``seat_backends``: each speaker
    (``client``/``responder``, or a group's participant ids) and the backend playing it. A
    finished dialogue's person is asked for their own verdict (the scenario's ``goal`` met?,
    the partner rated 1-5: ``person_goal_met``, ``person_rating``), which the goal judge is
    calibrated against."""
    replies: dict[int, PersonReply] = {}
    verdict: dict[str, Any] = {}
    for b in sorted(set(seat_backends.values())):
        backend = caller.backends.get(b)
        if isinstance(backend, HumanBackend):
            replies.update(backend.take(dialogue_id))
            if result.dialogue is not None and not verdict and backend.person is not None:
                verdict = await backend.person.debrief(
                    dialogue_id, goal, [(t.speaker, t.text) for t in result.turns],
                    result.dialogue.termination_reason)
    label = pairing_label(config, sides)
    if result.error is not None:
        result.error = ErrorRow(**{**result.error.as_record(), "pairing": label})
    kinds = {s: seat_kind(config, b) for s, b in seat_backends.items()}
    result.turns = [
        _widen(t, **(_typing(replies.get(t.turn_index)) if kinds.get(t.speaker) == "human" else {}))
        for t in result.turns
    ]
    result.participants = [
        _widen(p, kind=kinds.get(p.participant_id, "llm"),
               **(_person(config, [p.backend]) if kinds.get(p.participant_id) == "human" else {}))
        for p in result.participants
    ]
    if result.dialogue is not None:
        d = result.dialogue
        result.dialogue = _widen(
            d, pairing=label, client_kind=seat_kind(config, sides[0]),
            responder_kind=seat_kind(config, sides[1]),
            **_person(config, list(seat_backends.values())), **verdict)
