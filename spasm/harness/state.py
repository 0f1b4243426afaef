"""Layer 2, state as data: each agent's runtime state and the reducer that evolves it
(docs/harness.md, "The layers").

The state lives outside the model. Each turn the reducer asks the model for an *incremental*
update with evidence (role ``reducer``), then :func:`apply_update` enforces the hard constraints
in code, whatever the model proposed:

* no value moves by more than :data:`MAX_STEP` (20) in one turn;
* a change over :data:`EVIDENCE_STEP` (10) needs a quote found in the recent dialogue, else it
  is clipped to 10;
* with no stimulus, an extreme emotion or relation value (> 70 or < 30) moves
  :data:`DECAY` (10) toward 50. Goal progress is exempt: progress does not drift back to 50
  by itself, it only changes for a reason.

Every value the constraints changed against the model's proposal is a *clip*; the clips of a
turn are stored with the turn, so continuity can be audited (share of turns that needed one).
When the update is missing or malformed the previous state is kept unchanged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated

from pydantic import BeforeValidator, Field

# The state, its dimensions and the clip record are stored in turns.state / turns.state_log:
# they are declared once, with the other JSON columns, in the format layer.
from spasm.dataset.columns import (
    DIMENSIONS,
    EMOTIONS,
    RELATION,
    AgentState,
    Belief,
    Clip,
    Dimension,
    Emotions,
    Goal,
    Relation,
    StateLog,
    dump_state_log,
    first_items,
)
from spasm.harness._types import Line, Phrase, Reply, Score

if TYPE_CHECKING:
    from spasm.backends.base import Message
    from spasm.calls import Caller, CallScope, Structured
    from spasm.personas.persona import Persona

__all__ = [
    "DECAY",
    "DIMENSIONS",
    "EMOTIONS",
    "EVIDENCE_STEP",
    "MAX_STEP",
    "RELATION",
    "AgentState",
    "Change",
    "Clip",
    "Reduction",
    "StateUpdate",
    "apply_update",
    "constrain",
    "evidence_in",
    "initial_client_state",
    "initial_responder_state",
    "reduce_state",
    "salient_items",
]

MAX_STEP = 20
EVIDENCE_STEP = 10
DECAY = 10
EXTREME_HIGH, EXTREME_LOW, NEUTRAL = 70, 30, 50

# -- the model's incremental update -----------------------------------------------------------


class Change(Reply):
    """One proposed change: the new value of a dimension and the words that justify it."""

    dimension: Dimension
    value: Score
    evidence: Phrase = ""


#: At most four changes a turn, each with a short quote: bounded output for small models.
Changes = Annotated[list[Change], Field(max_length=4), BeforeValidator(first_items(4))]


class StateUpdate(Reply):
    """What the reducer model returns: only what changed, with evidence."""

    stimulus: bool = True
    changes: Changes = Field(default_factory=list)
    strategy: Line = ""
    new_belief: Phrase = ""
    drift_detected: bool = False


# -- hard constraints, in code ----------------------------------------------------------------


@dataclass
class Reduction:
    """The next state and what the constraints did to get there."""

    state: AgentState
    clips: list[Clip] = field(default_factory=list)
    decays: list[Clip] = field(default_factory=list)
    fallback: bool = False

    def log(self) -> str:
        """The clips, decays and fallback, as ``turns.state_log`` stores them."""
        return dump_state_log(StateLog(clips=self.clips, decays=self.decays,
                                       fallback=self.fallback))


_NON_WORD = re.compile(r"[^\w']+", re.UNICODE)


def _normalise(text: str) -> str:
    return " ".join(_NON_WORD.sub(" ", text.lower()).split())


def evidence_in(evidence: str, recent: str) -> bool:
    """Whether ``evidence`` quotes the recent dialogue (case, punctuation and spacing ignored).

    A quote must have at least two words or eight characters, so "I" or "ok" cannot justify a
    big swing.
    """
    quote = _normalise(evidence.strip().strip("\"'«»“”"))
    if len(quote) < 8 and len(quote.split()) < 2:
        return False
    return f" {quote} " in f" {_normalise(recent)} "


def _decay(value: int) -> int:
    if value > EXTREME_HIGH:
        return max(NEUTRAL, value - DECAY)
    if value < EXTREME_LOW:
        return min(NEUTRAL, value + DECAY)
    return value


def constrain(
    previous: int,
    proposed: int | None,
    *,
    evidence_ok: bool,
    stimulus: bool,
    decays: bool = True,
) -> tuple[int, str | None]:
    """The value a dimension may take next, and why it differs from the proposal (or ``None``).

    ``proposed`` is ``None`` when the model proposed no change for the dimension. Reasons:
    ``step`` (|Δ| capped at 20), ``evidence`` (|Δ| > 10 without a quote: capped at 10),
    ``no_stimulus`` (a change proposed while the model said nothing happened: ignored) and
    ``decay`` (an extreme value with no stimulus moved 10 toward 50).
    """
    if proposed == previous and not evidence_ok:
        # Restating a value without a quote is not a stimulus: it must not stop the decay.
        proposed = None
    if proposed is None or not stimulus:
        applied = _decay(previous) if decays else previous
        if proposed is not None and proposed != previous:
            return applied, "no_stimulus"
        return applied, "decay" if applied != previous else None
    delta = proposed - previous
    limit = MAX_STEP if evidence_ok else EVIDENCE_STEP
    if abs(delta) <= limit:
        return proposed, None
    applied = previous + (limit if delta > 0 else -limit)
    return applied, "step" if evidence_ok else "evidence"


def apply_update(previous: AgentState, update: StateUpdate | None, recent: str) -> Reduction:
    """Apply a model's update to ``previous`` under the hard constraints.

    ``recent`` is the text of the recent dialogue the update may quote. ``None`` (no usable
    update) keeps the previous state as it is and marks the reduction as a fallback.
    """
    if update is None:
        return Reduction(previous, fallback=True)
    proposals: dict[str, Change] = {c.dimension: c for c in update.changes}
    values: dict[str, int] = {}
    clips: list[Clip] = []
    decays: list[Clip] = []
    evidence: list[str] = []
    for dim in DIMENSIONS:
        old = previous.value(dim)
        change = proposals.get(dim)
        ok = change is not None and evidence_in(change.evidence, recent)
        if ok and change is not None and change.evidence:
            evidence.append(change.evidence)
        new, reason = constrain(
            old, change.value if change else None, evidence_ok=ok, stimulus=update.stimulus,
            decays=not dim.startswith("goal."),
        )
        values[dim] = new
        if reason == "decay":
            decays.append(Clip(dim, old, None, new, "decay"))
        elif reason is not None:
            assert change is not None
            clips.append(Clip(dim, old, change.value, new, reason))  # type: ignore[arg-type]
    state = previous.with_values(values)
    beliefs = list(state.beliefs)
    if update.new_belief and all(b.content != update.new_belief for b in beliefs):
        beliefs = [*beliefs, Belief(content=update.new_belief, confidence=60)][-5:]
    n_changes = len(proposals)
    control = state.control.model_copy(
        update={
            "drift_detected": update.drift_detected,
            "evidence": evidence[:5],
            # How much of the update was backed by quotes: a cheap self-check of the reducer.
            "confidence": round(100 * len(evidence) / n_changes) if n_changes else 50,
        }
    )
    state = state.model_copy(
        update={
            "beliefs": beliefs,
            "strategy": update.strategy or state.strategy,
            "control": control,
        }
    )
    return Reduction(state, clips, decays)


# -- initial states -----------------------------------------------------------------------------

#: Persona emotion → the Plutchik dimensions it raises (the schema's 12 emotions).
_EMOTION_MAP: dict[str, tuple[str, ...]] = {
    "anxious": ("fear", "anticipation"),
    "frustrated": ("anger",),
    "hopeful": ("anticipation", "joy"),
    "confused": ("surprise",),
    "angry": ("anger", "disgust"),
    "sad": ("sadness",),
    "curious": ("anticipation",),
    "overwhelmed": ("fear", "sadness"),
    "embarrassed": ("fear", "sadness"),
    "impatient": ("anger", "anticipation"),
    "skeptical": ("disgust",),
    "relieved": ("joy", "trust"),
}
_INTENSITY = {"mild": 62, "moderate": 74, "severe": 86}


def initial_client_state(client: Persona) -> AgentState:
    """The Client's state before the first message, from its persona's schema fields (each is
    read when present)."""
    fields = client.fields
    level = _INTENSITY.get(str(fields.get("intensity")), 74)
    emotions = {e: level for e in _EMOTION_MAP.get(str(fields.get("emotion")), ())}
    if fields.get("emotion") == "skeptical":
        emotions["trust"] = 100 - level
    relation = {
        "friendliness": {"resistant": 40, "neutral": 50, "cooperative": 60}.get(
            str(fields.get("cooperativeness")), 50
        ),
        "dominance": {"indirect": 40, "balanced": 50, "direct": 62}.get(
            str(fields.get("directness")), 50
        ),
    }
    goals = []
    if fields.get("concern"):
        goals.append(Goal(description=f"Resolve: {fields['concern']}", priority=90))
    if fields.get("motivation"):
        goals.append(Goal(description=str(fields["motivation"]).capitalize(), priority=70))
    return AgentState(
        goals=goals, emotions=Emotions(**emotions), relation=Relation(**relation),
        strategy="Explain your concern and see how they respond.",
    )


def initial_responder_state(role: str) -> AgentState:
    """The Responder's state: calm, attentive, with the goal its role implies."""
    return AgentState(
        goals=[Goal(description=f"Understand what the person needs and help, as a {role}",
                    priority=90)],
        emotions=Emotions(anticipation=58, trust=55),
        strategy="Listen, ask what you need to know, then help.",
    )


# -- what goes into the prompt ------------------------------------------------------------------


def _level(value: int) -> str:
    if value >= 85:
        return "very high"
    if value >= 70:
        return "high"
    if value >= 60:
        return "somewhat raised"
    if value <= 15:
        return "very low"
    if value <= 30:
        return "low"
    return "moderate"


def salient_items(state: AgentState, n: int = 4) -> list[str]:
    """The ``n`` (3–5) most relevant state items, as short sentences; never the whole state.

    Relevance: the top goal first, then the values furthest from neutral, then the strategy.
    """
    items: list[tuple[float, str]] = []
    if state.goals:
        g = max(state.goals, key=lambda g: g.priority)
        items.append((1000.0, f"Main goal: {g.description} (progress {g.progress}/100)."))
    for e in EMOTIONS:
        v = getattr(state.emotions, e)
        if abs(v - NEUTRAL) >= 10:
            items.append((abs(v - NEUTRAL), f"Your {e} is {_level(v)} ({v}/100)."))
    for r in RELATION:
        v = getattr(state.relation, r)
        if abs(v - NEUTRAL) >= 10:
            items.append((abs(v - NEUTRAL) - 1, f"Your {r} toward them is {_level(v)} ({v}/100)."))
    if state.beliefs:
        b = max(state.beliefs, key=lambda b: b.confidence)
        items.append((b.confidence / 10, f"You believe: {b.content}"))
    ranked = [text for _, text in sorted(items, key=lambda x: -x[0])]
    if state.strategy:
        # The strategy always makes the cut: it is what the agent acts on next.
        ranked = [*ranked[: max(0, n - 1)], f"Your current strategy: {state.strategy}"]
    return ranked[:n]


def compact(state: AgentState) -> str:
    """The state in one short block, as the reducer and the checker see it."""
    emo = ", ".join(f"{e} {getattr(state.emotions, e)}" for e in EMOTIONS)
    rel = ", ".join(f"{r} {getattr(state.relation, r)}" for r in RELATION)
    goal = f"{state.goals[0].description} (progress {state.goals[0].progress})" if state.goals else "-"
    return f"emotion: {emo}\nrelation: {rel}\ngoal: {goal}\nstrategy: {state.strategy or '-'}"


def reducer_messages(name: str, state: AgentState, recent_lines: str) -> list[Message]:
    """The reducer prompt: stable instructions first, then the state and the latest messages."""
    return [
        {
            "role": "system",
            "content": f"You track the inner state of {name} during a conversation. Values are "
            "0-100 (50 is neutral). Given the current state and the latest messages, report only "
            "what changed: each change gives the dimension, its new value and, as evidence, the "
            "exact words from the latest messages that caused it. Set stimulus to false when "
            "the latest messages give no reason for any change. Also give the strategy for the "
            "next message in one sentence.",
        },
        {
            "role": "user",
            "content": f"Current state of {name}:\n{compact(state)}\n\nLatest messages:\n"
            f"{recent_lines}\n\nReply with JSON only.",
        },
    ]


async def reduce_state(
    caller: Caller,
    backend: str,
    name: str,
    previous: AgentState,
    recent_lines: str,
    scope: CallScope,
    *,
    temperature: float,
    max_tokens: int,
    seed: int | None,
) -> Structured[Reduction]:
    """One reducer step: ask for the update (role ``reducer``), then enforce the constraints
    (the result carries the call's usage)."""
    result = await caller.structured(
        "reducer", backend, reducer_messages(name, previous, recent_lines), StateUpdate, scope,
        temperature=temperature, max_tokens=max_tokens, seed=seed,
    )
    return result.map(lambda update: apply_update(previous, update, recent_lines))
