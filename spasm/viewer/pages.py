"""What the dialogue and side-by-side pages show, built from a :class:`DialogueView`.

Pure functions over the rows the dataset package returns: the turns with their verification
mark, the echo evidence of ``spasm eval`` located in the utterances, the harness details per
turn. Nothing here produces markup: text is cut into segments the template escapes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from spasm.dataset import DialogueView
from spasm.dataset.columns import CheckerVerdict, Clip, load_state_log, load_verdict
from spasm.errors import FormatError

__all__ = ["Segment", "TurnView", "card_reached_responder", "evidence_quotes", "segments", "turn_views"]

_EVIDENCE = re.compile(r'^(client|responder) turn (\d+)(?: repeats the \w+)?: "(.*)"$', re.S)


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


def turn_views(view: DialogueView, eval_row: Mapping[str, Any] | None) -> list[TurnView]:
    """Every turn of ``view`` with its verification mark, evidence and harness details."""
    speakers = [str(t["speaker"]) for t in view.turns]
    quotes = evidence_quotes(eval_row.get("echo_evidence") if eval_row else None, speakers)
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
            reducer_fallback=bool(log and log.fallback),
        ))
    return out


def card_reached_responder(view: DialogueView) -> bool | None:
    """Whether the persona card appears in anything the Responder was sent (``None``: no card
    or no Responder turn to check). The page says so next to the card."""
    card = (view.persona["card"] if view.persona else "").strip()
    responder = [i for i, t in enumerate(view.turns) if t.get("speaker") == "responder"]
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
    return {
        "index": index, "speaker": turn["speaker"], "verified": seen.verified,
        "digest": turn.get("messages_sha256"), "stored": bool(turn.get("messages")),
        "messages": [{"role": str(m.get("role")), "content": str(m.get("content") or "")}
                     for m in seen.messages],
        "condition": view.row.get("condition"),
    }
