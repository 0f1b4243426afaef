"""The JSON columns of the run tables, declared once: one typed model and one dump/load pair each.

Five columns hold JSON text in Parquet. Every writer serialises through the ``dump_*`` function
and every reader parses through the ``load_*`` function of its column, so the shape of what is
stored is declared here and nowhere else:

========================  ================================  ====================================
column                    model                             dump / load
========================  ================================  ====================================
``turns.state``           :class:`AgentState`               :func:`dump_state` / :func:`load_state`
``turns.state_log``       :class:`StateLog` (of Clip)       :func:`dump_state_log` / :func:`load_state_log`
``turns.checker_verdict`` :class:`CheckerVerdict`           :func:`dump_verdict` / :func:`load_verdict`
``turns.probe``           a list of :class:`Probe`          :func:`dump_probes` / :func:`load_probes`
                          (+ :class:`PersonaProbe`)         / :func:`load_persona_probes`
``calls.params``          :class:`CallParams`               :func:`dump_params` / :func:`load_params`
========================  ================================  ====================================

**Bytes.** Each dump writes one fixed text per value (key order, separators and
``ensure_ascii`` fixed), so run digests (tests/golden/run.json) and stored runs compare equal
(``test_each_dump_writes_the_bytes_spasm_wrote_before_the_models``): ``state`` compact
(``","``/``":"``) with non-ASCII kept;
``state_log`` compact with non-ASCII escaped; ``checker_verdict`` and ``probe`` with the default
separators and non-ASCII kept; ``params`` with sorted keys, default separators, non-ASCII
escaped.

**Reading.** A load returns ``None`` (an empty list for probes) for a null or empty cell, reads
the older formats a column had (the single-probe dict of runs before depth probes), and raises
:class:`~spasm.errors.FormatError` naming the column for anything else — text that is not JSON,
or JSON of the wrong shape — never a bare ``JSONDecodeError`` or ``KeyError``.

The state's dimensions (:data:`EMOTIONS`, :data:`RELATION`, :data:`DIMENSIONS`) are declared
here with the state, for the reducer, the metrics and the viewer's charts alike. The bounded
value types (:data:`Score`, :data:`Line`, …) are those of the harness's structured replies
(:mod:`spasm.harness._types` re-exports them): a value the harness writes into its state is
clamped and cut by the same rule as one a model proposes.

This module is the format layer: it imports nothing of spasm but :mod:`spasm.errors`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
)

from spasm.errors import FormatError

__all__ = [
    "DIMENSIONS",
    "EMOTIONS",
    "RELATION",
    "SCORE_CHOICES",
    "AgentState",
    "Belief",
    "CallParams",
    "Check",
    "CheckerVerdict",
    "Clip",
    "Control",
    "Dimension",
    "Emotions",
    "Goal",
    "Line",
    "Lines5",
    "PersonaProbe",
    "Probe",
    "Record",
    "Relation",
    "Score",
    "StateLog",
    "clamp_to",
    "dump_params",
    "dump_probes",
    "dump_state",
    "dump_state_log",
    "dump_verdict",
    "first_items",
    "load_params",
    "load_persona_probes",
    "load_probes",
    "load_state",
    "load_state_log",
    "load_verdict",
    "truncate_to",
]

# -- bounded value types ------------------------------------------------------------------------


def truncate_to(n: int) -> Callable[[Any], Any]:
    """A before-validator that strips a string and cuts it to ``n`` characters."""

    def cut(value: Any) -> Any:
        if isinstance(value, str):
            return value.strip()[:n]
        return value

    return cut


def clamp_to(lo: int, hi: int) -> Callable[[Any], Any]:
    """A before-validator that rounds a number into ``[lo, hi]`` (booleans left alone)."""

    def clamp(value: Any) -> Any:
        if isinstance(value, bool):
            return value
        if isinstance(value, int | float):
            return round(min(hi, max(lo, float(value))))
        return value

    return clamp


def first_items(n: int) -> Callable[[Any], Any]:
    """A before-validator that keeps the first ``n`` items of a list."""

    def head(value: Any) -> Any:
        if isinstance(value, list):
            return value[:n]
        return value

    return head


#: The values a model may write for a score. llama.cpp ignores ``minimum``/``maximum`` when it
#: builds a grammar, and a small model then writes "fact": 123456789… until max_tokens cuts
#: the JSON; an enum bounds it. Steps of 5 keep the grammar small; parsing accepts any integer.
SCORE_CHOICES = list(range(0, 101, 5))

Score = Annotated[
    int,
    Field(ge=0, le=100, json_schema_extra={"enum": SCORE_CHOICES}),
    BeforeValidator(clamp_to(0, 100)),
]
"""An integer on the 0–100 scale every harness value uses (clamped, never rejected)."""

Line = Annotated[str, Field(max_length=140), BeforeValidator(truncate_to(140))]
"""One sentence: a fact, a rule, a question, a piece of advice."""

Lines5 = Annotated[list[Line], Field(max_length=5), BeforeValidator(first_items(5))]


class Record(BaseModel):
    """Base of harness records: unknown keys are ignored (models add chatter), values typed."""

    model_config = ConfigDict(extra="ignore")


# -- turns.state --------------------------------------------------------------------------------

EMOTIONS = ("joy", "sadness", "anger", "fear", "trust", "surprise", "disgust", "anticipation")
"""Plutchik's eight basic emotions, in the order the state stores them."""
RELATION = ("trust", "intimacy", "dominance", "friendliness")
"""How an agent relates to its partner, in the order the state stores them."""
DIMENSIONS: tuple[str, ...] = (
    *(f"emotion.{e}" for e in EMOTIONS),
    *(f"relation.{r}" for r in RELATION),
    "goal.progress",
)
"""Every numeric dimension of the state, as the reducer names them."""
Dimension = Literal[
    "emotion.joy", "emotion.sadness", "emotion.anger", "emotion.fear", "emotion.trust",
    "emotion.surprise", "emotion.disgust", "emotion.anticipation", "relation.trust",
    "relation.intimacy", "relation.dominance", "relation.friendliness", "goal.progress",
]


class Emotions(Record):
    """Plutchik's eight basic emotions, 0–100 (50 is the resting level)."""

    joy: Score = 50
    sadness: Score = 50
    anger: Score = 50
    fear: Score = 50
    trust: Score = 50
    surprise: Score = 50
    disgust: Score = 50
    anticipation: Score = 50


class Relation(Record):
    """How this agent relates to its partner, 0–100."""

    trust: Score = 50
    intimacy: Score = 40
    dominance: Score = 50
    friendliness: Score = 50


class Goal(Record):
    """Something the agent wants from this conversation."""

    description: Line
    priority: Score = 50
    progress: Score = 0


class Belief(Record):
    """Something the agent now holds true, with how sure it is."""

    content: Line
    confidence: Score = 50


class Control(Record):
    """Bookkeeping the harness keeps next to the character's state."""

    drift_detected: bool = False
    violations: Lines5 = Field(default_factory=list)
    correction: Line = ""
    evidence: Lines5 = Field(default_factory=list)
    confidence: Score = 50


Goals = Annotated[list[Goal], Field(max_length=3), BeforeValidator(first_items(3))]
Beliefs = Annotated[list[Belief], Field(max_length=5), BeforeValidator(first_items(5))]


class AgentState(Record):
    """The runtime state of one agent in one dialogue (docs/harness.md, "The layers"), as
    ``turns.state`` holds it."""

    goals: Goals = Field(default_factory=list)
    beliefs: Beliefs = Field(default_factory=list)
    emotions: Emotions = Emotions()
    relation: Relation = Relation()
    strategy: Line = ""
    control: Control = Control()

    def value(self, dimension: str) -> int:
        """The value of a numeric dimension such as ``emotion.anger`` or ``goal.progress``."""
        group, name = dimension.split(".")
        if group == "emotion":
            return int(getattr(self.emotions, name))
        if group == "relation":
            return int(getattr(self.relation, name))
        return self.goals[0].progress if self.goals else 0

    def with_values(self, values: dict[str, int]) -> AgentState:
        """A copy with some numeric dimensions replaced."""
        emotions = self.emotions.model_copy(
            update={k.split(".")[1]: v for k, v in values.items() if k.startswith("emotion.")}
        )
        relation = self.relation.model_copy(
            update={k.split(".")[1]: v for k, v in values.items() if k.startswith("relation.")}
        )
        goals = list(self.goals)
        if "goal.progress" in values and goals:
            goals[0] = goals[0].model_copy(update={"progress": values["goal.progress"]})
        return self.model_copy(update={"emotions": emotions, "relation": relation, "goals": goals})

    def to_json(self) -> str:
        """The state as ``turns.state`` stores it (:func:`dump_state`)."""
        return dump_state(self)


def dump_state(state: AgentState) -> str:
    """``turns.state``: compact JSON, fields in declaration order, non-ASCII kept."""
    return json.dumps(state.model_dump(mode="json"), ensure_ascii=False, separators=(",", ":"))


def load_state(raw: object) -> AgentState | None:
    """The state stored in one ``turns.state`` cell (``None`` for an empty cell)."""
    return _load("turns.state", raw, lambda data: AgentState.model_validate(data))


# -- turns.state_log ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Clip:
    """A value the constraints changed against the model's proposal (or a decay)."""

    dimension: str
    previous: int
    proposed: int | None
    applied: int
    reason: Literal["step", "evidence", "no_stimulus", "decay"]


class StateLog(BaseModel):
    """``turns.state_log``: what the reducer's hard constraints did on one turn."""

    model_config = ConfigDict(extra="forbid")

    clips: list[Clip] = Field(default_factory=list)
    decays: list[Clip] = Field(default_factory=list)
    #: The update was missing or malformed: the previous state was kept.
    fallback: bool = False


def dump_state_log(log: StateLog) -> str:
    """``turns.state_log``: compact JSON, non-ASCII escaped."""
    return json.dumps(log.model_dump(mode="json"), separators=(",", ":"))


def load_state_log(raw: object) -> StateLog | None:
    """The log stored in one ``turns.state_log`` cell (``None`` for an empty cell)."""
    return _load("turns.state_log", raw, lambda data: StateLog.model_validate(data))


# -- turns.checker_verdict ----------------------------------------------------------------------


class Check(BaseModel):
    """One check of a candidate reply: the checker's scores, or the code screen's decision."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    passed: bool = Field(alias="pass")
    overall_score: float
    dimension_scores: dict[str, int]
    violations: list[str]
    correction_advice: str
    rule_violations: list[str] = Field(default_factory=list)
    #: A boundary was breached (the code screen, or a failing boundary score).
    boundary_violation: bool
    #: ``model`` (the checker scored it) or ``code`` (the code screen failed it; no call made).
    source: str = "model"

    def record(self) -> dict[str, Any]:
        """The check as stored (``pass`` is the stored key, not ``passed``)."""
        return self.model_dump(mode="json", by_alias=True)


class CheckerVerdict(BaseModel):
    """``turns.checker_verdict``: what the checks of one accepted reply said.

    ``mode`` is ``verify`` (the agent's own checker, level E: the final check's fields, every
    check in ``checks``, and whether the reply was ``rewritten``) or ``audit`` (one check made
    outside the agent, never rewritten). ``pass`` is ``None`` when the last check got no usable
    answer; ``fallback`` is set when the checker never answered (then no check fields).
    A field that does not apply is left out of the stored JSON, not written as ``null``.
    """

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    mode: Literal["verify", "audit"]
    passed: bool | None = Field(alias="pass")
    fallback: bool = False
    overall_score: float | None = None
    dimension_scores: dict[str, int] | None = None
    violations: list[str] | None = None
    correction_advice: str | None = None
    rule_violations: list[str] | None = None
    boundary_violation: bool | None = None
    source: str | None = None
    checks: list[Check] | None = None
    rewritten: bool | None = None

    @classmethod
    def of(
        cls, mode: Literal["verify", "audit"], final: Check | None, *, passed: bool | None,
        checks: Sequence[Check] | None = None, rewritten: bool | None = None,
    ) -> CheckerVerdict:
        """The verdict whose last check is ``final`` (``None``: the checker never answered)."""
        if final is None:
            return cls(mode=mode, passed=None, fallback=True,
                       checks=None if checks is None else list(checks), rewritten=rewritten)
        fields = final.model_dump(exclude={"passed"})
        return cls(mode=mode, passed=passed, **fields,
                   checks=None if checks is None else list(checks), rewritten=rewritten)

    @model_serializer(mode="wrap")
    def _stored(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        return {k: v for k, v in data.items()
                if k == "pass" or (v is not None and not (k == "fallback" and v is False))}

    def record(self) -> dict[str, Any]:
        """The verdict as stored, as a plain mapping."""
        return self.model_dump(mode="json", by_alias=True)


def dump_verdict(verdict: CheckerVerdict | Mapping[str, Any]) -> str:
    """``turns.checker_verdict``: default separators, non-ASCII kept. A mapping (the harness's
    record of a turn) is validated against :class:`CheckerVerdict` first, so a misspelled or
    undeclared key fails here rather than landing in the run."""
    if not isinstance(verdict, CheckerVerdict):
        try:
            verdict = CheckerVerdict.model_validate(verdict)
        except ValidationError as exc:
            raise FormatError(f"not a checker verdict: {_first_error(exc)}") from exc
    return json.dumps(verdict.record(), ensure_ascii=False)


def load_verdict(raw: object) -> CheckerVerdict | None:
    """The verdict stored in one ``turns.checker_verdict`` cell (``None`` for an empty cell)."""
    return _load("turns.checker_verdict", raw, lambda data: CheckerVerdict.model_validate(data))


# -- turns.probe --------------------------------------------------------------------------------


class _ProbeRecord(BaseModel):
    """A probe's stored form: its ``error`` is left out of the JSON when the call worked."""

    model_config = ConfigDict(extra="forbid")

    @model_serializer(mode="wrap")
    def _stored(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if data.get("error") is None:
            data.pop("error", None)
        return data


class Probe(_ProbeRecord):
    """One recall probe (:mod:`spasm.harness.probe`): a partner message an agent was asked
    about after the dialogue, and how much of it the answer recalled."""

    model_config = ConfigDict(extra="forbid")

    #: The configured depth (fraction of the dialogue) that chose the message.
    depth: float = 0.0
    #: The probed utterance's index in the dialogue.
    index: int | None = None
    #: Its place among the partner's messages, 1 = the first.
    partner_message: int | None = None
    #: Utterances said after it.
    distance: int | None = None
    #: Whether it was still verbatim in the agent's prompt.
    in_window: bool | None = None
    facts: list[str] = Field(default_factory=list)
    answer: str | None = None
    #: Share of ``facts`` found in the answer (``None``: no fact, or the call failed).
    recall: float | None = None
    #: The error's type when the probe call failed (left out of the JSON otherwise).
    error: str | None = None


class PersonaProbe(_ProbeRecord):
    """One persona probe (``harness.persona_probes``): a question about the Client itself,
    built from one persona field, put to it after the dialogue, and its answer — judged
    against the card by ``spasm eval --consistency`` (Q&A consistency)."""

    model_config = ConfigDict(extra="forbid")

    #: The persona field the question is about (``age``, ``occupation``, ``city`` …).
    field: str
    question: str
    #: The field's value on the card.
    expected: str
    answer: str | None = None
    #: The error's type when the probe call failed (left out of the JSON otherwise).
    error: str | None = None


def dump_probes(
    probes: Sequence[Probe | Mapping[str, Any]],
    persona: Sequence[PersonaProbe | Mapping[str, Any]] | None = None,
) -> str:
    """``turns.probe``: ``{"probes": [...]}``, default separators, non-ASCII kept, plus
    ``"persona": [...]`` when persona probes are given (without them the text is exactly
    what runs before persona probes stored). Mappings are validated first."""
    try:
        typed = [p if isinstance(p, Probe) else Probe.model_validate(p) for p in probes]
    except ValidationError as exc:
        raise FormatError(f"not a recall probe: {_first_error(exc)}") from exc
    cell: dict[str, Any] = {"probes": [p.model_dump(mode="json") for p in typed]}
    if persona is not None:
        try:
            asked = [p if isinstance(p, PersonaProbe) else PersonaProbe.model_validate(p)
                     for p in persona]
        except ValidationError as exc:
            raise FormatError(f"not a persona probe: {_first_error(exc)}") from exc
        cell["persona"] = [p.model_dump(mode="json") for p in asked]
    return json.dumps(cell, ensure_ascii=False)


def load_persona_probes(raw: object) -> list[PersonaProbe]:
    """The persona probes stored in one ``turns.probe`` cell (empty when it has none: an
    empty cell, or any format without the ``persona`` key)."""

    def parse(data: Any) -> list[PersonaProbe]:
        items = data.get("persona", []) if isinstance(data, dict) else []
        if not isinstance(items, list):
            raise FormatError("\"persona\" is not a list")
        return [PersonaProbe.model_validate(p) for p in items]

    return _load("turns.probe", raw, parse) or []


def load_probes(raw: object, n_utterances: int | None = None) -> list[Probe]:
    """The probes stored in one ``turns.probe`` cell, whichever format wrote them.

    New runs store ``{"probes": [...]}``; a plain list is read too; a run from before depth
    probes holds one dict about the partner's first message (``opening_index``, ``in_window``,
    ``facts``, ``answer``, ``recall``), read as a depth-0 probe whose ``distance`` is filled in
    from ``n_utterances`` when given. Empty for an empty cell.
    """

    def parse(data: Any) -> list[Probe]:
        if isinstance(data, dict) and "probes" in data:
            items = data["probes"]
        elif isinstance(data, list):
            items = data
        elif isinstance(data, dict):
            legacy = dict(data)
            index = legacy.pop("opening_index", None)
            legacy = {"depth": 0.0, "index": index, "partner_message": 1, **legacy}
            if n_utterances is not None and isinstance(index, int):
                legacy.setdefault("distance", n_utterances - 1 - index)
            items = [legacy]
        else:
            raise FormatError("expected {\"probes\": [...]}, a list of probes or an old single probe")
        if not isinstance(items, list):
            raise FormatError("\"probes\" is not a list")
        return [Probe.model_validate(p) for p in items]

    return _load("turns.probe", raw, parse) or []


# -- calls.params -------------------------------------------------------------------------------


class CallParams(BaseModel):
    """``calls.params``: the sampling parameters of one call (``ChatRequest.params``)."""

    model_config = ConfigDict(extra="forbid")

    #: As given: an integer temperature stays an integer, so the stored text does not change.
    temperature: int | float
    max_tokens: int
    seed: int | None = None
    #: The request asked for structured output (a JSON schema).
    structured: bool = False
    #: Distinguishes deliberate repeats of an identical request.
    sample_index: int = 0
    #: The names of the tools the request offered (a tool step of a turn); absent
    #: from the text of calls without tools, so their params carry no ``tools`` key.
    tools: list[str] | None = None


def dump_params(params: CallParams | Mapping[str, Any]) -> str:
    """``calls.params``: sorted keys, default separators, non-ASCII escaped."""
    if not isinstance(params, CallParams):
        try:
            params = CallParams.model_validate(params)
        except ValidationError as exc:
            raise FormatError(f"not call parameters: {_first_error(exc)}") from exc
    data = params.model_dump(mode="json")
    if data["tools"] is None:
        del data["tools"]
    return json.dumps(data, sort_keys=True)


def load_params(raw: object) -> CallParams | None:
    """The parameters stored in one ``calls.params`` cell (``None`` for an empty cell)."""
    return _load("calls.params", raw, lambda data: CallParams.model_validate(data))


# -- shared ---------------------------------------------------------------------------------------

T = TypeVar("T")


def _first_error(exc: ValidationError) -> str:
    errors = exc.errors()
    first = errors[0]
    where = ".".join(str(p) for p in first["loc"]) or "value"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: {first['msg']}{more}"


def _load(column: str, raw: object, parse: Callable[[Any], T]) -> T | None:
    """Parse one cell of ``column``: ``None`` for null/empty, else ``parse(json)`` with every
    failure reported as a :class:`FormatError` that names the column and shows the value."""
    if raw is None or raw == "" or (isinstance(raw, float) and raw != raw):  # NaN: pandas' null
        return None
    if not isinstance(raw, str):
        raise FormatError(f"{column} holds a {type(raw).__name__}, not JSON text")
    shown = raw if len(raw) <= 80 else raw[:77] + "..."
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise FormatError(f"{column} is not valid JSON ({exc.msg} at character {exc.pos}): "
                          f"{shown!r}") from exc
    try:
        return parse(data)
    except ValidationError as exc:
        raise FormatError(f"{column} does not match its format: {_first_error(exc)}; value "
                          f"{shown!r}") from exc
    except FormatError as exc:
        raise FormatError(f"{column} does not match its format: {exc}; value {shown!r}") from exc
