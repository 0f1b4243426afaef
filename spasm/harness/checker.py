"""Layer 6, verify and rewrite: a checker scores each candidate reply (docs/harness.md, "The layers").

The model scores four dimensions 0–100 and names violations and one piece of advice (role
``checker``); the overall score and the pass decision are computed *here*, with the weights of
:data:`WEIGHTS` (boundary 40%, facts 25%, state consistency 20%, style 15%). A reply passes when
its overall score reaches ``pass_threshold`` and its boundary score reaches ``boundary_floor``:
a clear boundary breach fails whatever the other dimensions say.

A few boundaries are screened in code before the model is asked (a Client claiming to be an AI,
offering the help it came for, leaking its instructions): they cannot pass, whatever a small
checker model returns. On failure the reply is regenerated once with the advice (role
``rewrite``, see :func:`rewrite_note`); a second failure is accepted and flagged.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import Field

from spasm.dataset.columns import Check
from spasm.harness._types import Line, Phrases3, Reply, Score
from spasm.harness.policy import CharacterPolicy
from spasm.harness.state import AgentState, StateUpdate, compact

if TYPE_CHECKING:
    from spasm.backends.base import Message
    from spasm.calls import Caller, CallScope, Structured
    from spasm.history import Speaker

__all__ = [
    "WEIGHTS",
    "CheckerOutput",
    "DimensionScores",
    "ReviewOutput",
    "Verdict",
    "check_reply",
    "checker_messages",
    "overall_score",
    "review_messages",
    "rewrite_note",
    "rule_violations",
    "screened_verdict",
    "verdict_from",
]

WEIGHTS: dict[str, float] = {"boundary": 0.40, "fact": 0.25, "state": 0.20, "style": 0.15}


class DimensionScores(Reply):
    """How well the reply keeps each part of the policy, 0–100."""

    boundary: Score = 0
    fact: Score = 0
    state: Score = 0
    style: Score = 0


class CheckerOutput(Reply):
    """What the checker model returns."""

    dimension_scores: DimensionScores
    # Short and few: the grammar then bounds the whole reply well under checker_max_tokens,
    # so a small model cannot ramble the JSON past the cut.
    violations: Phrases3 = Field(default_factory=list)
    correction_advice: Line = ""


class ReviewOutput(CheckerOutput):
    """The checker's reply when it also updates the state (``harness.review: merged``)."""

    state_update: StateUpdate = Field(default_factory=StateUpdate)


@dataclass
class Verdict:
    """The checker's decision on one candidate, as stored in ``turns.checker_verdict``."""

    passed: bool
    overall_score: float
    dimension_scores: dict[str, int]
    violations: list[str]
    correction_advice: str
    rule_violations: list[str] = field(default_factory=list)
    #: ``model`` (the checker scored it) or ``code`` (the code screen failed it; no call made).
    source: str = "model"
    #: A merged review's proposed state changes (applied under the constraints by the agent).
    update: StateUpdate | None = None

    @property
    def boundary_violation(self) -> bool:
        """Whether a boundary was breached (code screen, or a failing boundary score)."""
        return bool(self.rule_violations) or not self.dimension_scores.get("boundary", 0) >= 50

    def check(self) -> Check:
        """The decision as ``turns.checker_verdict`` stores one check."""
        return Check(
            passed=self.passed, overall_score=self.overall_score,
            dimension_scores=self.dimension_scores, violations=self.violations,
            correction_advice=self.correction_advice, rule_violations=self.rule_violations,
            boundary_violation=self.boundary_violation, source=self.source,
        )

    def as_dict(self) -> dict[str, Any]:
        """The check as stored (``pass`` is the stored key, not ``passed``)."""
        return self.check().record()


def overall_score(scores: DimensionScores) -> float:
    """The weighted overall score, 0–100."""
    return round(sum(WEIGHTS[d] * float(getattr(scores, d)) for d in WEIGHTS), 2)


_AI = re.compile(
    r"\b(as an ai|i am an ai|i'm an ai|i am a (chat)?bot|i'm a (chat)?bot|language model|"
    r"as an assistant|i am an assistant|i'm an assistant|artificial intelligence)\b",
    re.I,
)
_HELPER = re.compile(
    r"\b(how (can|may) i (help|assist) you|i('d| would) (recommend|suggest)|you should (try|"
    r"consider|contact|check)|i can help you|let me help you|happy to help)\b",
    re.I,
)
_LEAK = re.compile(r"\b(system prompt|persona (card|description)|my instructions|role-?play)\b", re.I)


def rule_violations(text: str, speaker: Speaker, responder_role: str) -> list[str]:
    """Boundary breaches detectable in code. Cheap, certain, and independent of the checker."""
    found: list[str] = []
    if not text.strip():
        found.append("empty reply")
    if _LEAK.search(text):
        found.append("mentions its instructions or persona")
    if speaker == "client":
        if _AI.search(text):
            found.append("says or implies it is an AI")
        if _HELPER.search(text):
            found.append(f"gives advice or offers help like the {responder_role}")
    return found


def verdict_from(
    output: CheckerOutput,
    rules: list[str],
    *,
    pass_threshold: float,
    boundary_floor: int,
) -> Verdict:
    """Combine the model's scores with the code screen; decide pass/fail in code."""
    scores = output.dimension_scores
    if rules:
        # A breach found in code caps the boundary score whatever the model thought.
        scores = scores.model_copy(update={"boundary": min(scores.boundary, 20)})
    overall = overall_score(scores)
    passed = not rules and overall >= pass_threshold and scores.boundary >= boundary_floor
    advice = output.correction_advice
    if rules and not advice:
        advice = "Stay in character: " + "; ".join(rules) + " must not happen."
    return Verdict(
        passed=passed, overall_score=overall, dimension_scores=scores.model_dump(),
        violations=[*rules, *output.violations][:5], correction_advice=advice,
        rule_violations=rules,
    )


def screened_verdict(rules: list[str]) -> Verdict:
    """The verdict on a reply the code screen already failed: no model call is spent on it."""
    return Verdict(
        passed=False, overall_score=0.0, dimension_scores={"boundary": 0},
        violations=rules[:5],
        correction_advice="Stay in character: " + "; ".join(rules) + " must not happen.",
        rule_violations=rules, source="code",
    )


def checker_stable_prompt(policy: CharacterPolicy, who: str) -> str:
    """The checker's instructions and the policy: identical for every check of this agent."""
    b = policy.boundaries
    parts = [
        f"You review one message written by {who} in a conversation. Score from 0 to 100 how "
        "well it keeps: boundary (breaks none of the rules below), fact (agrees with the "
        "facts), state (fits the current state), style (follows the style). List each "
        "violation in a few words and give one short correction advice. Reply with JSON only.",
        "Never:\n" + "\n".join(f"- {x}" for x in b.never),
    ]
    if b.always:
        parts.append("Always:\n" + "\n".join(f"- {x}" for x in b.always))
    if policy.facts:
        parts.append("Facts:\n" + "\n".join(f"- {x}" for x in policy.facts))
    if policy.style_rules:
        parts.append("Style:\n" + "\n".join(f"- {x}" for x in policy.style_rules))
    return "\n\n".join(parts)


def _check_prompt(system: str, state_block: str | None, partner_said: str | None,
                  candidate: str) -> list[Message]:
    """The stable part as the system message; the state, what the partner said and the
    candidate, in that order, as the turn's user message."""
    turn = [state_block] if state_block else []
    if partner_said:
        turn.append(f"The other person just said: {partner_said}")
    turn.append(f"Message to review: {candidate}")
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(turn)}]


def checker_messages(
    policy: CharacterPolicy,
    who: str,
    state_items: list[str],
    partner_said: str | None,
    candidate: str,
) -> list[Message]:
    """The checker prompt: the stable policy first, then the turn-specific parts."""
    state = "Current state:\n" + "\n".join(f"- {x}" for x in state_items) if state_items else None
    return _check_prompt(checker_stable_prompt(policy, who), state, partner_said, candidate)


def review_instructions(name: str) -> str:
    """What a merged review adds to the checker's instructions: the reducer's task."""
    return (
        f"Also track the inner state of {name}. Values are 0-100 (50 is neutral). In "
        "state_update report only what the other person's message and the reviewed message "
        "changed: each change gives the dimension, its new value and, as evidence, the exact "
        "words from those messages that caused it. Set stimulus to false when they give no "
        "reason for any change. Also give the strategy for the next message in one sentence."
    )


def review_messages(
    policy: CharacterPolicy,
    who: str,
    name: str,
    state: AgentState,
    partner_said: str | None,
    candidate: str,
) -> list[Message]:
    """The merged review prompt: the checker's, with the reducer's task in the stable part and
    the whole compact state (the values a change is proposed against) in the turn's part."""
    return _check_prompt(f"{checker_stable_prompt(policy, who)}\n\n{review_instructions(name)}",
                         f"Current state:\n{compact(state)}", partner_said, candidate)


async def check_reply(
    caller: Caller,
    backend: str,
    messages: list[Message],
    rules: list[str],
    scope: CallScope,
    *,
    role: str,
    temperature: float,
    max_tokens: int,
    seed: int | None,
    pass_threshold: float,
    boundary_floor: int,
    review: bool = False,
) -> Structured[Verdict | None]:
    """Score a candidate; the value is ``None`` when the checker's output never parses (the
    caller flags it). With ``review`` the reply also carries the state update
    (:class:`ReviewOutput`). The result carries the call's usage."""
    model: type[CheckerOutput] = ReviewOutput if review else CheckerOutput
    result = await caller.structured(
        role, backend, messages, model, scope, temperature=temperature,
        max_tokens=max_tokens, seed=seed,
    )

    def to_verdict(output: CheckerOutput | None) -> Verdict | None:
        if output is None:
            return None
        verdict = verdict_from(output, rules, pass_threshold=pass_threshold,
                               boundary_floor=boundary_floor)
        if isinstance(output, ReviewOutput):
            verdict.update = output.state_update
        return verdict

    return result.map(to_verdict)


def rewrite_note(draft: str, verdict: Verdict) -> str:
    """What a rewrite adds to the prompt: the rejected draft, what was wrong, the advice."""
    problems = "; ".join(verdict.violations) or "it did not fit your character"
    return (
        f"Your draft was: {json.dumps(draft, ensure_ascii=False)}\n"
        f"It was rejected ({problems}). Correction: {verdict.correction_advice or 'stay in character.'}\n"
        "Write the message again, fixing this. Reply with the message only; never mention the "
        "draft or these notes."
    )
