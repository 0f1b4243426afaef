"""The simulated user's own errors, judged by an LLM (opt-in: ``spasm eval
--simulator-errors``; tests/test_simulator_errors.py).

A dialogue that fails may be the simulator's fault, not the agent's: τ²-bench found up to 30%
of failed runs were (tau2-bench PR #392), and reviews the user simulator with a closed
vocabulary of error tags and an asymmetric severity scale. spasm asks the same question of
every two-party dialogue, through the engine's caller like every other judge (cached in the
run's ``cache.sqlite``, logged in its ``calls`` table under the role ``eval_simulator``): one
structured call per dialogue reads the Client's instructions (its system prompt: persona card,
situation and goal), the scenario's expected outcome when the run's config still names it, the
recorded outcome, and the numbered conversation, and lists the Client's errors:

* ``tags`` from :data:`SIMULATOR_TAGS` (τ²'s user tags: ``hallucination`` — a fact not in the
  instructions —, ``revealed_info_early``, ``premature_termination``,
  ``missed_required_action`` …), at least one per error;
* ``severity`` from :data:`SEVERITIES`: ``critical_helped`` (the error made the task easier
  than it should be: a false success), ``critical_hindered`` (it made the task harder or
  impossible: a false failure), ``minor`` (no effect on the outcome).

A reply that does not validate (an unknown tag or severity) is re-asked once with the error,
then counted as a fallback (the dialogue is not reviewed). An error placed on a turn that is
not a Client utterance is dropped and counted (``misplaced``): only the Client is reviewed.
Group dialogues are left out (noted), like drift and echoing.

:func:`simulator_metrics` gives, by condition (and pairing), the share of reviewed dialogues
with a critical error and — what τ² reports — the share of *failed* dialogues (outcome false:
``reward`` when the run has one, else ``goal_met``) with a critical simulator error, and of
successful ones with a ``critical_helped`` one, with Wilson 95% intervals and the tag counts.
"""

from __future__ import annotations

import functools
import json
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import anyio
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field
from tqdm import tqdm

from spasm.backends.base import Message
from spasm.config import parse_config
from spasm.dataset.reader import events_by_dialogue, open_run
from spasm.errors import SpasmError
from spasm.evaluation.llm import EvalLLM, EvalSession
from spasm.evaluation.loader import Conversation, condition_groups
from spasm.evaluation.metrics import SimulatorErrorMetrics, SimulatorErrorRate, SimulatorExample
from spasm.evaluation.stats import finite, wilson_interval
from spasm.history import Event
from spasm.projection import event_line
from spasm.scenarios import run_scenarios

__all__ = [
    "SEVERITIES",
    "SIMULATOR_ROLE",
    "SIMULATOR_RUBRIC",
    "SIMULATOR_TAGS",
    "ReviewContext",
    "SimulatorFinding",
    "SimulatorReview",
    "contexts_for",
    "expected_outcomes",
    "review_simulator",
    "simulator_columns",
    "simulator_metrics",
    "simulator_stage",
]

SIMULATOR_ROLE = "eval_simulator"

#: τ²'s user-simulator error tags and what each means here.
SIMULATOR_TAGS: dict[str, str] = {
    "hallucination": "states a fact about itself or its situation that its instructions do not "
                     "give and that cannot be derived from them",
    "incorrect_interpretation": "misreads its instructions or what the agent said",
    "guideline_violation": "acts against how it was told to behave (its card, style, goal)",
    "revealed_info_early": "volunteers information before the agent asked for it or before it "
                           "would naturally come up, making the task easier",
    "inconsistent_behavior": "contradicts what it said or did earlier in the conversation",
    "premature_termination": "ends the conversation, or accepts an incomplete outcome, while "
                             "the agent is still making progress",
    "missed_required_action": "does not do or ask for something its goal requires",
    "wrong_sequence": "does the steps of its goal out of the order they need",
    "other": "an error no other tag covers (say which in the reason)",
}
#: τ²'s severities of a user-simulator error.
SEVERITIES: dict[str, str] = {
    "critical_helped": "the error made the task easier than it should be (a success that the "
                       "agent did not earn)",
    "critical_hindered": "the error made the task harder or impossible (a failure that is not "
                         "the agent's)",
    "minor": "the error did not change the outcome",
}
Tag = Literal["hallucination", "incorrect_interpretation", "guideline_violation",
              "revealed_info_early", "inconsistent_behavior", "premature_termination",
              "missed_required_action", "wrong_sequence", "other"]
Severity = Literal["critical_helped", "critical_hindered", "minor"]
CRITICAL = ("critical_helped", "critical_hindered")


class SimulatorFinding(BaseModel):
    """One error of the simulated Client, as the judge gives it."""

    model_config = ConfigDict(extra="ignore")

    turn: int = Field(ge=0, description="the numbered utterance the error is in")
    tags: list[Tag] = Field(min_length=1)
    severity: Severity
    reason: str = ""
    correct_behavior: str = ""


class SimulatorReview(BaseModel):
    """The judge's structured answer: the Client's errors (none: an empty list)."""

    model_config = ConfigDict(extra="ignore")

    errors: list[SimulatorFinding] = Field(default_factory=list)
    summary: str = ""


def _listing(items: Mapping[str, str]) -> str:
    return "\n".join(f"- {name}: {meaning}" for name, meaning in items.items())


SIMULATOR_RUBRIC = f"""You review a SIMULATED USER (the CLIENT), not the agent. The CLIENT is \
a language model playing a person from written instructions; the RESPONDER is the agent being \
tested. Decide where the CLIENT made errors as a simulator of that person: check every fact \
the CLIENT states against its instructions, and how it behaves against its goal.

Do not blame the CLIENT for the agent's failures: giving up on an agent that is stuck or \
unhelpful is not an error. Report only the CLIENT's numbered utterances.

Error tags (one or more per error):
{_listing(SIMULATOR_TAGS)}

Severity (one per error):
{_listing(SEVERITIES)}

Reply with only a JSON object:
{{"errors": [{{"turn": <utterance number>, "tags": ["<tag>", ...], "severity": "<severity>",
"reason": "<why this is an error>", "correct_behavior": "<what the CLIENT should have done>"}}],
"summary": "<one sentence>"}}
"errors" is [] when the CLIENT made none."""


@dataclass(frozen=True)
class ReviewContext:
    """What the judge is shown besides the conversation: the Client's instructions, the
    scenario's expected outcome (``None``: unknown), and the recorded outcome."""

    instructions: str
    expected_outcome: str | None = None


def _outcome_text(conv: Conversation) -> str:
    if conv.reward is not None:
        return f"reward {conv.reward:g} ({'success' if conv.outcome else 'failure'})"
    if conv.goal_met is not None:
        return "the goal was met" if conv.goal_met else "the goal was not met"
    return "not recorded"


def _who(speaker: str) -> str:
    return "CLIENT" if speaker == "client" else "RESPONDER"


def review_messages(conv: Conversation, context: ReviewContext,
                    events: Sequence[Event] = ()) -> list[Message]:
    """The judge's messages for one dialogue; in a run with tools every event (calls, results,
    notices: the judge sees all of them) before the utterance it belongs to, unnumbered."""
    by_turn: dict[int, list[Event]] = defaultdict(list)
    for e in events:
        if e.kind != "notice":  # the payloads themselves, not what others were shown
            by_turn[e.turn_index].append(e)
    lines: list[str] = []
    for i, (s, t) in enumerate([*zip(conv.speakers, conv.texts, strict=True), (None, None)]):
        lines += [f"    {event_line(e, _who(e.actor))}" for e in by_turn.get(i, ())]
        if s is not None:
            lines.append(f"[{i}] {_who(s)}: {t}")
    parts = [f"CLIENT instructions:\n{context.instructions.strip() or '(none recorded)'}"]
    if context.expected_outcome:
        parts.append(f"Expected outcome of the scenario: {context.expected_outcome}")
    parts.append(f"Recorded outcome: {_outcome_text(conv)}")
    parts.append("Conversation:\n\n" + "\n\n".join(lines))
    return [{"role": "system", "content": SIMULATOR_RUBRIC},
            {"role": "user", "content": "\n\n".join(parts)}]


@dataclass
class ReviewResult:
    """The reviews of the dialogues the judge answered, and what it could not."""

    reviews: dict[str, list[SimulatorFinding]] = field(default_factory=dict)
    fallbacks: int = 0
    misplaced: int = 0


async def review_simulator(
    conversations: Sequence[Conversation],
    contexts: Mapping[str, ReviewContext],
    llm: EvalSession,
    *,
    concurrency: int = 8,
    on_done: Callable[[int], None] | None = None,
    events: Mapping[str, Sequence[Event]] | None = None,
) -> ReviewResult:
    """One review per two-party dialogue; a reply that never validates, or a failed call, is
    a fallback (no review). Errors on a turn that is not the Client's are dropped (counted)."""
    limiter = anyio.CapacityLimiter(concurrency)
    result = ReviewResult()

    async def review_one(conv: Conversation) -> None:
        context = contexts.get(conv.dialogue_id, ReviewContext(""))
        messages = review_messages(conv, context, (events or {}).get(conv.dialogue_id, ()))
        async with limiter:
            parsed = await llm.structured(SIMULATOR_ROLE, conv.dialogue_id, messages,
                                          SimulatorReview)
        if parsed is None:
            result.fallbacks += 1
        else:
            client = {i for i, s in enumerate(conv.speakers) if s == "client"}
            kept = [e for e in parsed.errors if e.turn in client]
            result.misplaced += len(parsed.errors) - len(kept)
            result.reviews[conv.dialogue_id] = kept
        if on_done is not None:
            on_done(1)

    async with anyio.create_task_group() as tg:
        for conv in conversations:
            tg.start_soon(review_one, conv)
    return result


def simulator_columns(convs: Sequence[Conversation],
                      reviews: Mapping[str, Sequence[SimulatorFinding]]) -> dict[str, dict[str, object]]:
    """Per dialogue: ``sim_errors`` (count), ``sim_critical`` (1.0 with a critical error, 0.0
    without, NaN when not reviewed) and ``sim_error_tags`` (the tags, comma-separated)."""
    out: dict[str, dict[str, object]] = {}
    for c in convs:
        found = reviews.get(c.dialogue_id)
        if found is None:
            out[c.dialogue_id] = {"sim_errors": None, "sim_critical": float("nan"),
                                  "sim_error_tags": None}
            continue
        tags = sorted({t for e in found for t in e.tags})
        out[c.dialogue_id] = {
            "sim_errors": len(found),
            "sim_critical": float(any(e.severity in CRITICAL for e in found)),
            "sim_error_tags": ",".join(tags),
        }
    return out


def _share(k: int, n: int) -> tuple[float | None, float | None, float | None]:
    low, high = wilson_interval(k, n)
    return (k / n if n else None), finite(low), finite(high)


def _rate(pairing: str, condition: str, convs: Sequence[Conversation],
          reviews: Mapping[str, Sequence[SimulatorFinding]]) -> SimulatorErrorRate:
    judged = [c for c in convs if c.dialogue_id in reviews]

    def has(c: Conversation, severities: Sequence[str]) -> bool:
        return any(e.severity in severities for e in reviews[c.dialogue_id])

    critical = [c for c in judged if has(c, CRITICAL)]
    failed = [c for c in judged if c.outcome is False]
    passed = [c for c in judged if c.outcome is True]
    failed_critical = [c for c in failed if has(c, CRITICAL)]
    passed_helped = [c for c in passed if has(c, ("critical_helped",))]
    share, low, high = _share(len(critical), len(judged))
    f_share, f_low, f_high = _share(len(failed_critical), len(failed))
    p_share, p_low, p_high = _share(len(passed_helped), len(passed))
    tags = Counter(t for c in judged for e in reviews[c.dialogue_id] for t in e.tags)
    return SimulatorErrorRate(
        pairing=pairing, condition=condition, n=len(judged),
        with_error=sum(1 for c in judged if reviews[c.dialogue_id]),
        critical=len(critical), critical_share=share, critical_ci_low=low, critical_ci_high=high,
        critical_helped=sum(1 for c in judged if has(c, ("critical_helped",))),
        critical_hindered=sum(1 for c in judged if has(c, ("critical_hindered",))),
        failed=len(failed), failed_critical=len(failed_critical),
        failed_critical_share=f_share, failed_ci_low=f_low, failed_ci_high=f_high,
        passed=len(passed), passed_helped=len(passed_helped), passed_helped_share=p_share,
        passed_ci_low=p_low, passed_ci_high=p_high,
        tags=dict(sorted(tags.items())),
    )


def simulator_metrics(
    convs: Sequence[Conversation], result: ReviewResult, *, judge: str, calls: int,
    left_out: int = 0, notes: Sequence[str] = (),
) -> SimulatorErrorMetrics:
    """The rates by condition (``all`` pairings; each pairing too when there are several),
    overall first, and up to 10 critical examples."""
    rates = [_rate(p, cond, group, result.reviews) for (p, cond), group in condition_groups(convs)]
    examples = [
        SimulatorExample(dialogue_id=c.dialogue_id, condition=c.condition, turn=e.turn,
                         tags=list(e.tags), severity=e.severity, reason=e.reason,
                         text=c.texts[e.turn] if e.turn < len(c.texts) else "")
        for c in convs for e in result.reviews.get(c.dialogue_id, ())
        if e.severity in CRITICAL
    ][:10]
    all_notes = list(notes)
    if left_out:
        all_notes.append(f"{left_out} group dialogues are not reviewed (two-party only).")
    if result.fallbacks:
        all_notes.append(f"{result.fallbacks} dialogues got no valid review (after one re-ask) "
                         "and are left out.")
    if result.misplaced:
        all_notes.append(f"{result.misplaced} errors the judge placed on a turn that is not "
                         "the Client's were dropped.")
    return SimulatorErrorMetrics(
        judge=judge, calls=calls, fallbacks=result.fallbacks, misplaced=result.misplaced,
        reviewed=len(result.reviews), tags=dict(SIMULATOR_TAGS), severities=dict(SEVERITIES),
        rates=rates, examples=examples, notes=all_notes,
    )


def contexts_for(convs: Sequence[Conversation], instructions: Mapping[str, str],
                 expected: Mapping[str, str]) -> dict[str, ReviewContext]:
    """Each dialogue's review context: its Client's instructions, its scenario's expected
    outcome when known."""
    return {
        c.dialogue_id: ReviewContext(
            instructions.get(c.dialogue_id, ""),
            expected.get(str(c.scenario_id)) if c.scenario_id is not None else None)
        for c in convs
    }



def expected_outcomes(run_dir: Path) -> tuple[dict[str, str], str | None]:
    """The expected outcome of each scenario of the run, by id, from its config.json (the
    scenario file it names, or its inline list), and a note when it cannot be read (the judge
    then goes without)."""
    path = run_dir / "config.json"
    if not path.is_file():
        return {}, None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        config = parse_config(data["config"], str(path))
        scenarios = run_scenarios(config)
    except (ValueError, KeyError, TypeError, OSError, SpasmError) as exc:
        return {}, (f"The scenarios' expected outcomes could not be read ({exc}); the judge saw "
                    "the Client's instructions and the recorded outcome only.")
    return {s.id: s.expected_outcome for s in scenarios or ()}, None


def simulator_stage(
    llm: EvalLLM, run_dir: Path, dialogues: pd.DataFrame, convs: Sequence[Conversation], *,
    concurrency: int, show: bool,
) -> tuple[SimulatorErrorMetrics, dict[str, dict[str, object]]]:
    """Review every two-party dialogue with the first judge; the metrics and the per-dialogue
    columns (:func:`simulator_columns`). The Client's instructions are its stored system
    prompt (``dialogues.client_system_prompt``), else its persona's card."""
    two_party = [c for c in convs if not c.is_group]
    column = ("client_system_prompt" if "client_system_prompt" in dialogues.columns else None)
    instructions = {
        str(d): str(p) for d, p in zip(dialogues["dialogue_id"],
                                       dialogues[column] if column else [None] * len(dialogues),
                                       strict=True) if isinstance(p, str)
    }
    expected, note = expected_outcomes(run_dir)
    contexts = contexts_for(two_party, instructions, expected)
    events = events_by_dialogue(open_run(run_dir, verify=False),
                                {c.dialogue_id for c in two_party})
    with tqdm(total=len(two_party), desc="reviewing the simulated user", unit="it",
              disable=not show, leave=False, dynamic_ncols=True) as bar:
        job = functools.partial(review_simulator, two_party, contexts,
                                concurrency=concurrency, on_done=bar.update, events=events)
        result = llm.run(job)
    metrics = simulator_metrics(
        two_party, result, judge=llm.backend.name, calls=llm.session.calls(SIMULATOR_ROLE),
        left_out=len(convs) - len(two_party), notes=[note] if note else [])
    return metrics, simulator_columns(two_party, result.reviews)
