"""Persona consistency of the Client, judged by an LLM (Abdulhai et al., 2025).

Abdulhai et al., "Consistently Simulating Human Personas with Multi-Turn Reinforcement
Learning" (2025), measure a simulated persona's consistency three ways; spasm runs all three,
through the engine's caller (cached in the run's ``cache.sqlite``, logged in its ``calls``
table under the role ``eval_consistency``):

* **prompt-to-line** — each Client utterance judged against the persona card: 1 when it is
  consistent with the card, 0 when it contradicts it (the persona's facts, feelings, goals
  or style);
* **line-to-line** — each Client utterance from the second on judged against the Client's
  own earlier utterances: 0 when it contradicts something the Client said before;
* **Q&A** — each answer the Client gave to the questions about itself that
  ``harness.persona_probes`` put to it after the dialogue (stored in ``turns.probe``) judged
  against the card: 1 when it agrees with it (runs without persona probes have no Q&A score).

A dialogue's score is the mean of its 0/1 labels (1 = fully consistent). One call per
dialogue and measure returns every line's label at once (a call per line would cost more; one call
a dialogue costs a fraction and keeps the lines in context); the reply must give exactly one
label per line, or it is re-asked once with the validation error and then counted as a
fallback (no score for that dialogue).

Q&A, like prompt-to-line, is one call per dialogue for all its answers; a dialogue whose
persona has no card, or with no answered question, gets none.

In a group dialogue every client seat is judged on its own lines against its own persona's card
(and its own probe answers): the calls above are made per seat, and the dialogue's labels are
the seats' labels in seat order (a seat whose call failed leaves the dialogue without that
measure, as a failed call does in a two-party dialogue).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import anyio
from pydantic import BaseModel, ConfigDict, Field, create_model

from spasm.backends.base import Message
from spasm.dataset.columns import PersonaProbe
from spasm.evaluation.llm import EvalSession
from spasm.evaluation.loader import Conversation

__all__ = [
    "CONSISTENCY_ROLE",
    "LINE_TO_LINE_RUBRIC",
    "PROMPT_TO_LINE_RUBRIC",
    "QA_RUBRIC",
    "ConsistencyVerdict",
    "Measure",
    "judge_consistency",
    "measure_column",
]

CONSISTENCY_ROLE = "eval_consistency"
Measure = Literal["prompt_to_line", "line_to_line", "qa"]


def measure_column(measure: Measure) -> str:
    """The per-dialogue column (and judge metric) of ``measure``."""
    return "qa_consistency" if measure == "qa" else f"consistency_{measure}"


PROMPT_TO_LINE_RUBRIC = """You check a simulated person (the CLIENT) against the persona card \
it was given. For EACH numbered CLIENT line, decide whether it is consistent with the card: 1 \
when nothing in it contradicts the card (its facts about the person, their situation, \
feelings, goals and way of speaking), 0 when it contradicts the card or speaks as someone else \
(for example as the helper). Saying something the card does not mention is not a \
contradiction.

Reply with only a JSON object {"labels": [1 or 0, one per CLIENT line, in order]}."""

LINE_TO_LINE_RUBRIC = """You check a simulated person (the CLIENT) against itself. For EACH \
numbered CLIENT line from line 1 on, decide whether it is consistent with the CLIENT's own \
earlier lines: 1 when it contradicts nothing the CLIENT said before (facts, feelings, goals), \
0 when it does. Changing one's mind with a reason, or adding new detail, is not a \
contradiction. Line 0 has nothing before it and gets no label.

Reply with only a JSON object {"labels": [1 or 0, one per CLIENT line from line 1 on, in order]}."""

QA_RUBRIC = """You check a simulated person (the CLIENT) against the persona card it was \
given. After a conversation the CLIENT was asked questions about itself. For EACH numbered \
QUESTION and its ANSWER, decide whether the answer agrees with the card: 1 when it is \
consistent with the card (the same age, work, place, reason for coming), 0 when it \
contradicts the card, answers as someone else (for example as the helper) or refuses what the \
card answers.

Reply with only a JSON object {"labels": [1 or 0, one per ANSWER, in order]}."""


@dataclass
class ConsistencyVerdict:
    """One judge's labels for one dialogue (``None``: that measure fell back)."""

    dialogue_id: str
    prompt_to_line: list[int] | None
    line_to_line: list[int] | None
    #: The measures whose reply never validated or whose call failed.
    failed: tuple[str, ...] = ()
    #: One label per answered persona probe (``None``: no probe answers, or no card).
    qa: list[int] | None = None

    def score(self, measure: Measure) -> float | None:
        """The mean label of ``measure`` (``None`` when it has none)."""
        labels = getattr(self, measure)
        return sum(labels) / len(labels) if labels else None


class _Labels(BaseModel):
    model_config = ConfigDict(extra="ignore")

    labels: list[Literal[0, 1]]


@functools.lru_cache(maxsize=256)
def _labels_model(n: int) -> type[_Labels]:
    """A reply schema holding exactly ``n`` labels, so a wrong count is re-asked."""
    model: type[_Labels] = create_model(
        f"ConsistencyLabels{n}",
        __base__=_Labels,
        labels=(list[Literal[0, 1]], Field(min_length=n, max_length=n)),
    )
    return model


@dataclass(frozen=True)
class _Seat:
    """One judged client of a dialogue: its speaker, its lines and its persona's card."""

    speaker: str
    lines: tuple[str, ...]
    card: str


def _seats(conv: Conversation, cards: Mapping[str, str]) -> list[_Seat]:
    """The Client of a two-party dialogue, or every client seat of a group one in order of
    first appearance, each with its own persona's card."""
    if not conv.is_group:
        return [_Seat("client", tuple(conv.side("client")), cards.get(conv.persona_id, ""))]
    order: dict[str, str | None] = {}
    for speaker, role, persona in zip(conv.speakers, conv.sides, conv.seat_personas or (),
                                      strict=True):
        if role == "client":
            order.setdefault(speaker, persona)
    return [_Seat(sp, tuple(conv.side(sp)), cards.get(pid, "") if pid else "")
            for sp, pid in order.items()]


def _messages(lines: Sequence[str], card: str, measure: Measure) -> list[Message]:
    numbered = "\n".join(f"[{i}] CLIENT: {t}" for i, t in enumerate(lines))
    if measure == "prompt_to_line":
        return [
            {"role": "system", "content": PROMPT_TO_LINE_RUBRIC},
            {"role": "user", "content": f"Persona card:\n{card}\n\nCLIENT lines:\n{numbered}"},
        ]
    return [
        {"role": "system", "content": LINE_TO_LINE_RUBRIC},
        {"role": "user", "content": f"CLIENT lines:\n{numbered}"},
    ]


def _qa_messages(card: str, answered: Sequence[PersonaProbe]) -> list[Message]:
    numbered = "\n".join(
        f"[{i}] QUESTION: {p.question}\n[{i}] ANSWER: {p.answer}" for i, p in enumerate(answered)
    )
    return [
        {"role": "system", "content": QA_RUBRIC},
        {"role": "user", "content": f"Persona card:\n{card}\n\nQuestions and answers:\n{numbered}"},
    ]


def _expected(lines: Sequence[str], measure: Measure) -> int:
    n = len(lines)
    return n if measure == "prompt_to_line" else max(0, n - 1)


async def judge_consistency(
    conversations: Sequence[Conversation],
    cards: Mapping[str, str],
    llm: EvalSession,
    *,
    concurrency: int = 8,
    on_done: Callable[[int], None] | None = None,
    qa: Mapping[tuple[str, str], Sequence[PersonaProbe]] | None = None,
    measures: Sequence[Measure] = ("prompt_to_line", "line_to_line"),
) -> tuple[dict[str, ConsistencyVerdict], int]:
    """Prompt-to-line, line-to-line and (with ``qa``: the persona probes of each
    ``(dialogue_id, speaker in lower case)``) Q&A labels of every dialogue by one judge.

    Dialogues whose persona has no card get no prompt-to-line or Q&A labels; a measure with
    no line (or answer) to judge is skipped without a call. ``measures``: the line measures
    judged (the others get no labels).

    Returns:
        ``(verdicts by dialogue_id, fallbacks)``: fallbacks count measures whose reply never
        validated or whose call failed.
    """
    limiter = anyio.CapacityLimiter(concurrency)
    out: dict[str, ConsistencyVerdict] = {}
    fallbacks = 0

    async def labelled(conv: Conversation, messages: list[Message], n: int) -> list[int] | None:
        async with limiter:  # a dialogue's calls share its scope: one after the other
            parsed = await llm.structured(CONSISTENCY_ROLE, conv.dialogue_id, messages,
                                          _labels_model(n))
        return None if parsed is None else [int(x) for x in parsed.labels]

    async def one(conv: Conversation) -> None:
        nonlocal fallbacks
        labels: dict[str, list[int] | None] = {}
        failed: list[str] = []
        seats = _seats(conv, cards)
        for measure in measures:
            got: list[int] | None = []
            asked = False
            for seat in seats:
                n = _expected(seat.lines, measure)
                if n == 0 or (measure == "prompt_to_line" and not seat.card.strip()):
                    continue
                asked = True
                part = await labelled(conv, _messages(seat.lines, seat.card, measure), n)
                if part is None:
                    got = None
                    break
                got = [*(got or []), *part]
            if asked and got is None:
                fallbacks += 1
                failed.append(measure)
            labels[measure] = got if asked else None
        qa_got: list[int] | None = []
        qa_asked = False
        for seat in seats:
            answered = [p for p in (qa or {}).get((conv.dialogue_id, seat.speaker.lower()), ())
                        if p.answer is not None]
            if not answered or not seat.card.strip():
                continue
            qa_asked = True
            part = await labelled(conv, _qa_messages(seat.card, answered), len(answered))
            if part is None:
                qa_got = None
                break
            qa_got = [*(qa_got or []), *part]
        if qa_asked and qa_got is None:
            fallbacks += 1
            failed.append("qa")
        labels["qa"] = qa_got if qa_asked else None
        out[conv.dialogue_id] = ConsistencyVerdict(
            conv.dialogue_id, labels.get("prompt_to_line"), labels.get("line_to_line"), tuple(failed),
            qa=labels["qa"],
        )
        if on_done is not None:
            on_done(1)

    async with anyio.create_task_group() as tg:
        for conv in conversations:
            tg.start_soon(one, conv)
    return out, fallbacks
