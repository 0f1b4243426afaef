"""What the dialogue and side-by-side pages show, built from a :class:`DialogueView`.

Pure functions over the rows the dataset package returns: the turns with their verification
mark, the echo evidence of ``spasm eval`` located in the utterances, the harness details per
turn, a group dialogue's participants (each with a colour from its seat). Nothing here produces
markup: text is cut into segments the template escapes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from spasm.dataset import DialogueView
from spasm.dataset.columns import CheckerVerdict, Clip, load_state_log, load_verdict
from spasm.errors import FormatError

__all__ = [
    "SeatView", "Segment", "TurnView", "card_reached_responder", "evidence_quotes", "reason_summary",
    "seat_kinds", "seat_views", "segments", "turn_views",
]

_EVIDENCE = re.compile(r'^(client|responder) turn (\d+)(?: repeats the \w+)?: "(.*)"$', re.S)
#: Participant colours: seat ``position`` gets class ``seat-{position % SEAT_COLOURS}``
#: (viewer.css declares seat-0 … seat-7, each dark text on a light tint).
SEAT_COLOURS = 8
#: A next-speaker reason's kind: the text before ":" (the moderator's reason) or " by " (who
#: addressed it).
_REASON_KIND = re.compile(r"^(.*?)(?::| by ).*$", re.S)


@dataclass(frozen=True)
class Segment:
    """A piece of an utterance; ``mark`` pieces are echo evidence."""

    text: str
    mark: bool = False


@dataclass
class TurnView:
    """One utterance as the dialogue page shows it."""

    index: int
    speaker: str
    segments: list[Segment]
    #: what the speaker saw matches ``messages_sha256`` (None: no digest stored)
    verified: bool | None
    n_seen: int
    evidence: bool
    row: dict[str, Any]
    checker: CheckerVerdict | None = None
    clips: list[Clip] = field(default_factory=list)
    decays: list[Clip] = field(default_factory=list)
    reducer_fallback: bool = False
    #: the speaker's seat in a group dialogue (``None``: two-party)
    seat: SeatView | None = None
    #: why the turn order chose this speaker (group dialogues)
    reason: str | None = None


@dataclass(frozen=True)
class SeatView:
    """One participant of a group dialogue as the page lists it."""

    position: int
    participant_id: str
    role: str
    persona_id: str | None
    backend: str
    model: str
    level: str
    #: the colour class index (stable: from the seat's position)
    colour: int
    n_turns: int = 0
    #: how its frames name the others: ``prefix`` ("Ana: …") or ``name_field``
    speaker_names: str = "prefix"
    #: who filled the seat (format 1.10: ``llm``, ``function``, ``human``; ``None`` in a run
    #: that does not record it) and, for a person, their pseudonym and interface
    kind: str | None = None
    operator: str | None = None
    interface: str | None = None


T = TypeVar("T")


def _cell(load: Callable[[object], T | None], raw: object) -> T | None:
    """A JSON column's value, or ``None`` when the cell is empty or does not parse: the page
    still shows the turn, without the harness details it cannot read."""
    try:
        return load(raw)
    except FormatError:
        return None


def evidence_quotes(evidence: str | None, speakers: Sequence[str]) -> dict[int, list[str]]:
    """Utterance index -> the quotes the echo evidence cites in it.

    Evidence items look like ``client turn 2: "…"`` (the rule; turn = that speaker's n-th
    turn) or are bare quotes (the judge), which are looked for in every utterance.
    """
    out: dict[int, list[str]] = {}
    for item in (evidence or "").split(" | "):
        item = item.strip()
        if not item:
            continue
        m = _EVIDENCE.match(item)
        if m is None:
            for i in range(len(speakers)):
                out.setdefault(i, []).append(item.strip('"'))
            continue
        speaker, nth, quote = m.group(1), int(m.group(2)), m.group(3)
        own = [i for i, s in enumerate(speakers) if s == speaker]
        if nth < len(own):
            out.setdefault(own[nth], []).append(quote)
    return out


def _pattern(quote: str) -> re.Pattern[str] | None:
    words = quote.rstrip("…").split()
    if len(words) < 2:
        return None
    return re.compile(r"\s+".join(re.escape(w) for w in words), re.I)


def segments(text: str, quotes: Sequence[str]) -> tuple[list[Segment], bool]:
    """``text`` cut into plain and marked segments, and whether any quote was found in it."""
    spans: list[tuple[int, int]] = []
    for quote in quotes:
        pattern = _pattern(quote)
        found = pattern.search(text) if pattern else None
        if found:
            spans.append(found.span())
    if not spans:
        return [Segment(text)], False
    spans.sort()
    merged: list[tuple[int, int]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    out, pos = [], 0
    for start, end in merged:
        if start > pos:
            out.append(Segment(text[pos:start]))
        out.append(Segment(text[start:end], mark=True))
        pos = end
    if pos < len(text):
        out.append(Segment(text[pos:]))
    return out, True


def seat_views(view: DialogueView) -> list[SeatView]:
    """A group dialogue's participants in seat order (``[]``: a two-party dialogue)."""
    spoke: dict[str, int] = {}
    for t in view.turns:
        spoke[str(t["speaker"])] = spoke.get(str(t["speaker"]), 0) + 1
    seats = sorted(view.participants, key=lambda p: int(p["position"]))
    return [
        SeatView(
            position=int(p["position"]), participant_id=str(p["participant_id"]),
            role=str(p.get("role") or ""),
            persona_id=None if p.get("persona_id") is None else str(p["persona_id"]),
            backend=str(p.get("backend") or ""), model=str(p.get("model") or ""),
            level=str(p.get("level") or "A"), colour=int(p["position"]) % SEAT_COLOURS,
            n_turns=spoke.get(str(p["participant_id"]), 0),
            speaker_names=str(p.get("speaker_names") or "prefix"),
            kind=_text(p.get("kind")), operator=_text(p.get("operator")),
            interface=_text(p.get("interface")),
        )
        for p in seats
    ]


def _text(value: object) -> str | None:
    return None if value is None or value == "" else str(value)


def seat_kinds(view: DialogueView) -> dict[str, dict[str, str | None]]:
    """A two-party dialogue's seats as format 1.10 records who filled them: ``client`` and
    ``responder`` -> kind (``llm``, ``function``, ``human``) and, for the person's seat, the
    pseudonymous operator and the interface (``{}``: a run that does not record kinds)."""
    row = view.row
    out: dict[str, dict[str, str | None]] = {}
    for side in ("client", "responder"):
        kind = _text(row.get(f"{side}_kind"))
        if kind is not None:
            human = kind == "human"
            out[side] = {"kind": kind, "operator": _text(row.get("operator")) if human else None,
                         "interface": _text(row.get("interface")) if human else None}
    return out


def reason_summary(view: DialogueView) -> list[tuple[str, int]]:
    """How often each kind of next-speaker reason chose the speaker (``opener``, ``round
    robin``, ``addressed``, ``moderator``…), in order of first use (``[]``: none stored)."""
    counts: dict[str, int] = {}
    for t in view.turns:
        reason = t.get("next_speaker_reason")
        if reason:
            m = _REASON_KIND.match(str(reason))
            kind = (m.group(1) if m else str(reason)).strip() or str(reason)
            counts[kind] = counts.get(kind, 0) + 1
    return list(counts.items())


def turn_views(view: DialogueView, eval_row: Mapping[str, Any] | None) -> list[TurnView]:
    """Every turn of ``view`` with its verification mark, evidence and harness details (and,
    in a group dialogue, its speaker's seat and why it spoke)."""
    speakers = [str(t["speaker"]) for t in view.turns]
    quotes = evidence_quotes(eval_row.get("echo_evidence") if eval_row else None, speakers)
    seats = {s.participant_id: s for s in seat_views(view)}
    out = []
    for i, turn in enumerate(view.turns):
        seen = view.seen(i)
        segs, found = segments(str(turn.get("text") or ""), quotes.get(i, []))
        log = _cell(load_state_log, turn.get("state_log"))
        out.append(TurnView(
            index=int(turn["turn_index"]), speaker=speakers[i], segments=segs, verified=seen.verified,
            n_seen=len(seen.messages), evidence=found, row=turn,
            checker=_cell(load_verdict, turn.get("checker_verdict")),
            clips=list(log.clips) if log else [], decays=list(log.decays) if log else [],
            reducer_fallback=bool(log and log.fallback), seat=seats.get(speakers[i]),
            reason=str(turn["next_speaker_reason"]) if turn.get("next_speaker_reason") else None,
        ))
    return out


def card_reached_responder(view: DialogueView) -> bool | None:
    """Whether the persona card appears in anything the Responder was sent (``None``: no card
    or no Responder turn to check). The page says so next to the card. In a group dialogue the
    Responder's turns are those of its responder seats."""
    card = (view.persona["card"] if view.persona else "").strip()
    responder = [i for i, t in enumerate(view.turns)
                 if (t.get("role") or t.get("speaker")) == "responder"]
    if not card or not responder:
        return None
    for i in responder:
        for message in view.seen(i).messages:
            if card in str(message.get("content") or ""):
                return True
    return False


def seen_rows(view: DialogueView, index: int) -> dict[str, Any]:
    """The messages the speaker of turn ``index`` was sent, for the "what it saw" panel."""
    seen = view.seen(index)
    turn = view.turns[index]
    group = bool(view.participants)
    return {
        "index": index, "speaker": turn["speaker"], "verified": seen.verified,
        # "the client" in a two-party dialogue; a group participant by its id ("Ana")
        "who": str(turn["speaker"]) if group else f"the {turn['speaker']}",
        "role": turn.get("role"),
        "digest": turn.get("messages_sha256"), "stored": bool(turn.get("messages")),
        "messages": [{"role": str(m.get("role")), "content": str(m.get("content") or ""),
                      # A run with tools: the speaker's own calls and the results it was sent.
                      "tool_calls": [(c["function"]["name"], c["function"]["arguments"], c["id"])
                                     for c in m.get("tool_calls") or ()],
                      "tool_call_id": m.get("tool_call_id")}
                     for m in seen.messages],
        "condition": view.row.get("condition"),
        "steps": len(seen.steps),
    }
