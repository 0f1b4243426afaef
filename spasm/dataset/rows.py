"""The rows of every run table, declared once: typed models mapped to their Arrow schemas.

Each table has one row model (``extra="forbid"``): building a row with an undeclared or
misspelled field is an error, never a silent null. The Arrow schema of a table is derived from
its model's fields and the Arrow type each field names (``Annotated[int, INT32]``), so the
Parquet files, the writer and the reader cannot drift apart.

The personas and persona-rejections tables carry one column per persona-schema field; their
models, and the :class:`~spasm.personas.persona.Persona` each personas row is to code, live in
:mod:`spasm.dataset.persona_rows` (the LLM call path and the dialogue loop import this module,
and they know no persona definitions).

The columns that hold JSON text with a typed shape (``turns.state``, ``state_log``,
``checker_verdict``, ``probe``, ``calls.params``) have their models and their one dump/load
pair in :mod:`spasm.dataset.columns`; :data:`JSON_COLUMNS` says which model each holds.

Schema versions (``SCHEMA_VERSION``; docs/format.md says what changed and how older runs are
read): 1.0 first release; 1.1 harness columns in ``turns``; 1.2 ``dialogues.harness_fallbacks``
and ``dialogues.source_id``, ``personas.persona_fields`` (an imported persona's source fields),
imports as table directories like generated runs; 1.3 ``calls.cached_tokens``; 1.4
``errors.traceback``; 1.5 ``personas.source_id`` and ``persona_rejections.source_id`` in runs
whose personas come from a data file (``personas.source``); 1.6 ``dialogues.scenario_id``,
``goal_met`` and ``goal_reason`` in runs with scenarios (:class:`ScenarioDialogueRow`); 1.7
group dialogues: a ``participants`` table, ``turns.role`` and ``turns.next_speaker_reason`` in
group runs (:class:`GroupTurnRow`, :class:`ParticipantRow`); 1.8 ``dialogues.trial`` in runs
with trials (:func:`with_trial_column`); 1.9 agents that act: ``events``
and ``worlds`` tables and ``dialogues.reward``, ``world_match`` and ``reward_detail`` in runs
with tools (:class:`EventRow`, :class:`WorldRow`, :class:`ActionDialogueRow`); 1.10 people in
seats: each seat's ``kind`` (``llm``, ``function``, ``human``), a human seat's ``operator`` and
``interface``, the typing a human turn measured, and the person's own verdict, in runs with a
human seat (:func:`human_row_model`).
"""

from __future__ import annotations

import functools
from datetime import datetime
from typing import Annotated, Any, ClassVar, get_args, get_origin

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, create_model

from spasm.dataset.columns import AgentState, CallParams, CheckerVerdict, Probe, StateLog

__all__ = [
    "JSON_COLUMNS",
    "ROW_MODELS",
    "SCHEMA_VERSION",
    "ActionDialogueRow",
    "AnnotationRow",
    "CallRow",
    "DialogueRow",
    "ErrorRow",
    "EventRow",
    "GroupTurnRow",
    "ParticipantRow",
    "QARow",
    "Row",
    "ScenarioDialogueRow",
    "TurnRow",
    "WorldRow",
    "arrow_schema",
    "human_row_model",
    "with_trial_column",
]

SCHEMA_VERSION = "1.10"

STRING, INT32, INT64, FLOAT64, BOOL = pa.string(), pa.int32(), pa.int64(), pa.float64(), pa.bool_()
TIMESTAMP = pa.timestamp("us", tz="UTC")


class Row(BaseModel):
    """Base of every table row: an unknown (misspelled) field is an error, never dropped."""

    model_config = ConfigDict(extra="forbid", strict=False, frozen=False)
    #: The table this model is a row of (``None`` for the per-schema persona models' base).
    table: ClassVar[str] = ""
    #: Sort and de-duplication keys (compaction, merge).
    keys: ClassVar[tuple[str, ...]] = ()

    def as_record(self) -> dict[str, Any]:
        """The row as a plain mapping of column to value (no copy of nested values)."""
        return dict(self.__dict__)


def _arrow_type(annotation: Any) -> pa.DataType:
    """The Arrow type a field names in its ``Annotated`` metadata (``X | None`` allowed)."""
    if get_origin(annotation) is Annotated:
        for meta in get_args(annotation)[1:]:
            if isinstance(meta, pa.DataType):
                return meta
    for arg in get_args(annotation):
        if arg is not type(None):
            try:
                return _arrow_type(arg)
            except TypeError:
                continue
    raise TypeError(f"field annotation {annotation!r} names no Arrow type")


def arrow_schema(model: type[Row]) -> pa.Schema:
    """The Arrow schema of a row model, columns in field order."""
    fields = []
    for name, info in model.model_fields.items():
        # pydantic strips Annotated metadata into ``info.metadata``: look there first.
        arrow = next((m for m in info.metadata if isinstance(m, pa.DataType)), None)
        fields.append((name, arrow if arrow is not None else _arrow_type(info.annotation)))
    return pa.schema(fields)


Str = Annotated[str, STRING]
OptStr = Annotated[str | None, STRING]
I32 = Annotated[int, INT32]
I64 = Annotated[int, INT64]
F64 = Annotated[float, FLOAT64]
Flag = Annotated[bool, BOOL]
When = Annotated[datetime, TIMESTAMP]


class DialogueRow(Row):
    """One dialogue (docs/format.md, `dialogues`)."""

    table: ClassVar[str] = "dialogues"
    keys: ClassVar[tuple[str, ...]] = ("dialogue_id",)

    dialogue_id: Str
    persona_id: Str
    conversation_index: I32
    condition: Str
    harness_level: Str = "A"
    pairing: Str
    client_backend: Str
    client_model: Str
    responder_backend: Str
    responder_model: Str
    seed: I64
    responder_role: OptStr = None
    client_system_prompt: OptStr = None
    responder_system_prompt: OptStr = None
    n_utterances: I32
    termination_reason: Str
    termination_detail: OptStr = None
    prompt_tokens: I64 = 0
    completion_tokens: I64 = 0
    n_calls: I32 = 0
    #: Harness calls of this dialogue that fell back (no usable structured output).
    harness_fallbacks: I32 = 0
    status: Str = "ok"
    #: An imported dialogue's id in its source, as JSON (the release's ``conversation_id``).
    source_id: OptStr = None


class ScenarioDialogueRow(DialogueRow):
    """A dialogue of a run with scenarios (1.6): every :class:`DialogueRow` column, then the
    scenario's. Only such runs store these columns (every other run keeps the columns it had,
    byte for byte); readers see them in every run, null where a run has none."""

    scenario_id: OptStr = None
    #: The goal judge's decision (``None``: no judge, or it gave no usable answer).
    goal_met: Annotated[bool | None, BOOL] = None
    goal_reason: OptStr = None


class ActionDialogueRow(ScenarioDialogueRow):
    """A dialogue of a run with tools (1.9): every :class:`ScenarioDialogueRow` column, then
    its reward as τ² measures it. Only runs with tools store these columns."""

    #: The product of the success parts the scenario asks for (``None``: it asks for none).
    reward: Annotated[float | None, FLOAT64] = None
    #: The final world's hash equals the gold world's (``None``: no reference actions).
    world_match: Annotated[bool | None, BOOL] = None
    #: JSON: each part asked for and its value (``world``, ``actions``, ``must_say``,
    #: ``judge``), the final and gold hashes, and the reference calls not made.
    reward_detail: OptStr = None


@functools.cache
def with_trial_column(model: type[DialogueRow]) -> type[DialogueRow]:
    """``model``'s dialogues row with ``trial`` last (1.8): a run with ``trials: K`` runs every
    planned dialogue K times, trial 0..K-1 each with its own seed. Only such runs store the
    column (every other run keeps its columns byte for byte); readers see it in every run,
    null where a run has none. One class per model (cached), so a row's type is the table's."""
    fields: dict[str, Any] = {"trial": (I32, ...)}
    made: type[DialogueRow] = create_model(f"{model.__name__}WithTrial", __base__=model,
                                           **fields)
    made.__doc__ = f"A dialogue of a run with trials: every {model.__name__} column, then ``trial``."
    return made


class TurnRow(Row):
    """One utterance; the harness columns are empty at level A unless noted."""

    table: ClassVar[str] = "turns"
    keys: ClassVar[tuple[str, ...]] = ("dialogue_id", "turn_index")

    dialogue_id: Str
    turn_index: I32
    speaker: Str
    text: Str
    n_tokens: Annotated[int | None, INT32] = None
    prompt_tokens: Annotated[int | None, INT32] = None
    latency_s: Annotated[float | None, FLOAT64] = None
    #: Generation calls behind the accepted text (2 after a rewrite).
    attempts: I32 = 1
    checker_verdict: OptStr = None  # JSON: CheckerVerdict (columns.py)
    flagged: Flag = False
    messages_sha256: OptStr = None
    flag_reason: OptStr = None  # failed_twice | checker_unavailable
    intent: OptStr = None  # small_talk | venting | advice_seeking | task
    state: OptStr = None  # JSON: AgentState, the speaker's state after this turn (level C+)
    state_clips: I32 = 0  # values the reducer's hard constraints clipped
    state_log: OptStr = None  # JSON: StateLog, the clips, decays and fallback
    harness_fallbacks: I32 = 0  # harness calls that fell back this turn
    cached_prompt_tokens: I64 = 0  # prompt tokens a prefix cache serves
    messages: OptStr = None  # JSON: the exact messages seen (level B+)
    probe: OptStr = None  # JSON: {"probes": [Probe]}, on each speaker's last turn


class GroupTurnRow(TurnRow):
    """An utterance of a group dialogue (1.7): every :class:`TurnRow` column (``speaker`` is
    the participant's id), then its role and why it was chosen to speak. Only group runs store
    these columns; readers see them in every run, null where a run has none."""

    role: OptStr = None  # client | responder
    next_speaker_reason: OptStr = None  # opener | round robin | addressed by … | moderator: …


class ParticipantRow(Row):
    """One participant of a group dialogue (1.7; only group runs have this table)."""

    table: ClassVar[str] = "participants"
    keys: ClassVar[tuple[str, ...]] = ("dialogue_id", "position")

    dialogue_id: Str
    #: 0-based place in the turn order.
    position: I32
    participant_id: Str
    role: Str  # client | responder
    #: The persona a client seat is filled by (``None`` for a responder seat).
    persona_id: OptStr = None
    backend: Str
    model: Str
    level: Str = "A"
    #: A responder seat's role ("peer-support facilitator"; ``None`` for a client seat).
    responder_role: OptStr = None
    #: How its ECP frame names other speakers: ``prefix`` ("Ana: …") or ``name_field``.
    speaker_names: Str = "prefix"
    system_prompt: OptStr = None


class EventRow(Row):
    """One event of a dialogue (1.9; only runs with tools have this table): a tool call, its
    result or a notice, with who acted and who could see it (:class:`spasm.history.Event`)."""

    table: ClassVar[str] = "events"
    keys: ClassVar[tuple[str, ...]] = ("dialogue_id", "seq")

    dialogue_id: Str
    #: 0-based order of the event in its dialogue.
    seq: I32
    #: The utterance whose turn the event belongs to (it happened before that utterance).
    turn_index: I32
    kind: Str  # tool_call | tool_result | notice
    #: The participant who acted (``client``/``responder`` in a two-party dialogue).
    actor: Str
    #: Pairs a call with its result (the OpenAI tool_call_id).
    call_id: OptStr = None
    tool: OptStr = None
    arguments: OptStr = None  # JSON text, as the agent wrote it
    result: OptStr = None  # JSON text the tool returned
    error: OptStr = None  # why the call failed (schema, exception, timeout, not its tool)
    #: JSON list of the participant ids that may see the event.
    visible_to: Str
    #: The line participants other than the actor were shown for this event.
    notice: OptStr = None
    #: sha256 of the world's canonical JSON after the event.
    world_sha256: OptStr = None


class WorldRow(Row):
    """One state of a dialogue's world (1.9; only runs with tools have this table): the
    initial state, the state after each change, the final state, and the gold state the
    scenario's reference actions give."""

    table: ClassVar[str] = "worlds"
    keys: ClassVar[tuple[str, ...]] = ("dialogue_id", "seq")

    dialogue_id: Str
    #: 0-based order of the states of the dialogue.
    seq: I32
    kind: Str  # initial | change | final | gold
    #: The event (its ``events.seq``) that changed the world (``change`` rows only).
    event_seq: Annotated[int | None, INT32] = None
    world_sha256: Str
    #: The state as canonical JSON (sorted keys, compact).
    world: Str


#: Who fills a seat (1.10): a model (``llm``), code (``function``: ``kind: python``) or a person
#: (``human``: ``kind: human``, ``spasm play``; an imported conversation's people).
SeatKind = Annotated[str | None, STRING]
OptI32 = Annotated[int | None, INT32]

#: The columns a run with a human seat adds to each table (1.10), after the table's own. Only
#: such runs store them (every other run keeps its columns byte for byte); readers see them in
#: every run, null where a run has none. General enough for a person's turns that were not
#: typed here (an import fills ``interface: import`` and leaves the typing null).
HUMAN_COLUMNS: dict[str, dict[str, Any]] = {
    "dialogues": {
        "client_kind": (SeatKind, None),
        "responder_kind": (SeatKind, None),
        # The human seat's pseudonym and interface (a group's: the first human seat's).
        "operator": (OptStr, None),
        "interface": (OptStr, None),  # terminal | web | import
        # What the person said at the end of a play session (judge calibration): whether the
        # goal was met, and a 1-5 rating of the partner; None when not asked or not answered.
        "person_goal_met": (Annotated[bool | None, BOOL], None),
        "person_rating": (OptI32, None),
        # A dialogue a person took over from another at a turn ("take this seat"): the
        # original's id and the first turn that is new (the turns before it are the original's).
        "forked_from": (OptStr, None),
        "forked_at": (OptI32, None),
    },
    "participants": {
        "kind": (SeatKind, None),
        "operator": (OptStr, None),
        "interface": (OptStr, None),
    },
    "turns": {
        # A human turn's typing as its interface measured it (None: not measured, or a model).
        "typing_ms": (Annotated[int | None, INT64], None),
        "edits": (OptI32, None),
        "pasted_chars": (OptI32, None),
    },
}


@functools.cache
def human_row_model(base: type[Row]) -> type[Row]:
    """``base`` (a dialogues, turns or participants row model) with the human-seat columns of
    its table after its own (1.10): the model a run with a human seat writes."""
    model: type[Row] = create_model(f"Human{base.__name__}", __base__=base,
                                    **HUMAN_COLUMNS[base.table])
    return model


class CallRow(Row):
    """One LLM call attempt (a cache hit is a row too)."""

    table: ClassVar[str] = "calls"
    keys: ClassVar[tuple[str, ...]] = ("call_id",)

    call_id: Str
    dialogue_id: OptStr = None
    persona_id: OptStr = None
    role: Str
    backend: Str
    model: Str
    resolved_model: OptStr = None
    request_hash: Str
    params: Str  # JSON: CallParams
    attempt: I32
    prompt_tokens: I64 = 0
    completion_tokens: I64 = 0
    #: Prompt tokens the API reported as served from its prefix cache (0: none reported).
    cached_tokens: I64 = 0
    latency_s: F64 = 0.0
    cache_hit: Flag = False
    outcome: Str
    error: OptStr = None
    started_at: When


class ErrorRow(Row):
    """A quarantined dialogue: the error and the partial transcript."""

    table: ClassVar[str] = "errors"
    keys: ClassVar[tuple[str, ...]] = ("dialogue_id", "failed_at")

    dialogue_id: Str
    persona_id: Str
    condition: Str
    pairing: Str
    error_type: Str
    error: Str
    n_utterances: I32
    partial_transcript: Str
    failed_at: When
    #: The full traceback when the failure is not a run error (a bug: spasm's or a plugin's).
    traceback: OptStr = None


class QARow(Row):
    """One QA finding of ``spasm qa`` / ``spasm export`` (docs/export.md); the table is replaced
    whole by each scan."""

    table: ClassVar[str] = "qa"
    keys: ClassVar[tuple[str, ...]] = ("dialogue_id", "turn_index", "kind", "start")

    dialogue_id: Str
    #: The utterance the finding is in (``None``: the whole dialogue, e.g. a duplicate).
    turn_index: Annotated[int | None, INT32] = None
    #: ai_identity | prompt_leak | harness_notes | email | phone | url | number | empty_turn |
    #: alternation | duplicate | near_duplicate | off_language | role_flip
    kind: Str
    #: What was found (the matched text, or the other dialogue's id for a duplicate).
    evidence: Str
    #: Character offsets of the match in the utterance (``None`` for dialogue-level findings).
    start: Annotated[int | None, INT32] = None
    end: Annotated[int | None, INT32] = None
    #: The placeholder an export puts in its place (``[EMAIL]`` …), ``None`` if not redactable.
    redaction: OptStr = None
    found_at: When


class AnnotationRow(Row):
    """One human label of a dialogue. Append-only: a later label by the same annotator
    supersedes an earlier one (the latest ``labelled_at`` wins) without erasing it."""

    table: ClassVar[str] = "annotations"
    keys: ClassVar[tuple[str, ...]] = ("annotation_id",)

    annotation_id: Str
    dialogue_id: Str
    annotator: Str
    #: none | client | responder | both
    echoing: OptStr = None
    role_flip: Annotated[bool | None, BOOL] = None
    note: OptStr = None
    labelled_at: When


#: The JSON columns with a typed shape: table → column → the model of its JSON text.
JSON_COLUMNS: dict[str, dict[str, type[BaseModel]]] = {
    "turns": {"state": AgentState, "state_log": StateLog, "checker_verdict": CheckerVerdict,
              "probe": Probe},
    "calls": {"params": CallParams},
}

#: The fixed tables and their row models (personas tables depend on the persona schema).
ROW_MODELS: dict[str, type[Row]] = {
    m.table: m for m in (human_row_model(with_trial_column(ActionDialogueRow)),
                         human_row_model(GroupTurnRow), CallRow, ErrorRow, QARow, AnnotationRow,
                         human_row_model(ParticipantRow), EventRow, WorldRow)
}
