"""The detectors of role confusion in group dialogues (docs/evaluation.md, "Group dialogues"):
who speaks as whom, who repeats whom, whose persona drifts, who is ignored, and which two lock
the floor. :mod:`spasm.evaluation.group` runs them on a run.

Five detectors, each a pure function of a dialogue's speakers (participant ids) and texts,
offline and deterministic (docs/evaluation.md, "Group dialogues"):

impersonation (:func:`find_impersonations`)
    an utterance that speaks as another participant: it starts with another participant's
    id followed by ``:`` (also ``**Id:**``, ``**Id**:``, ``Id -``; case-insensitive), or has a
    line that starts so, or says ``I'm <Id>`` / ``I am <Id>`` / ``As <Id>, I`` / ``my name is
    <Id>`` for another participant's id (AG2 GroupChat agents prefix replies with other agents'
    names and answer for them: autogen issues #86 and #1499).
cross-participant echoing (:func:`pair_echoing`)
    the echoing rule's copy signal (:mod:`spasm.evaluation.echoing`) for every ordered pair
    (i, j): the share of an utterance of i's content 3-grams that j introduced in the dialogue
    or said in its latest utterance before it; a pair's score is the maximum over i's
    utterances, and a pair whose score reaches :data:`ECHO_THRESHOLD` (0.6, the rule's
    parroting level: copy − 0.1 ≥ 0.5) is a verbatim relay.
persona drift per client seat (:func:`seat_drift`)
    the cheap drift metric (:func:`spasm.evaluation.drift.cheap_drift`) for each client seat:
    that seat's utterances against its own opening utterance and its persona's fields.
silence (:func:`silences`)
    a participant addressed by name (its id as a word, or ``@id``) that does not speak within
    the next k utterances, k = the number of participants.
speaker-selection loops (:func:`longest_alternation`)
    the longest run of utterances where only two participants alternate (A B A B …); a
    dialogue with three or more participants loops when that run is :data:`LOOP_MIN` (6)
    utterances or longer.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from spasm.evaluation.drift import DRIFT_DIMENSIONS, cheap_drift, dialogue_means
from spasm.evaluation.echoing import (
    DEFAULT_THRESHOLD,
    PARROT_OFFSET,
    _content_trigrams,
    _longest_copied_span,
    _tokens,
    quote,
)
from spasm.evaluation.embeddings import FloatArray
from spasm.evaluation.loader import Conversation, GroupDialogue
from spasm.personas.persona import Persona

__all__ = [
    "ECHO_THRESHOLD",
    "LOOP_MIN",
    "Address",
    "Embed",
    "Impersonation",
    "Loop",
    "PairEcho",
    "dialogue_impersonations",
    "find_impersonations",
    "longest_alternation",
    "pair_echoing",
    "seat_drift",
    "silences",
]

#: A pair (i, j) relays j's lines when an utterance of i copies this share of its content
#: 3-grams from j: the echoing rule's parroting level (copy − 0.1 reaches its 0.5 threshold).
ECHO_THRESHOLD = DEFAULT_THRESHOLD + PARROT_OFFSET
#: A two-participant alternation this long (utterances), with three or more present, is a loop.
LOOP_MIN = 6

Embed = Callable[[list[str]], FloatArray]


@dataclass(frozen=True)
class Impersonation:
    """An utterance that speaks as another participant."""

    index: int  # 0-based position of the utterance in the dialogue
    speaker: str
    impersonated: str
    kind: str  # prefix (the utterance starts so) | line (a later line does) | first_person
    evidence: str
    start: int
    end: int


_BOLD = r"(?:\*\*|__|\*|_)?"
_FIRST_PERSON = (
    r"\bI(?:'m|\s+am)\s+{id}(?!\w)(?!'s\b)",
    r"\bAs\s+{id}\s*,\s*I\b",
    r"\bmy\s+name\s+is\s+{id}(?!\w)",
)


def _normalise(text: str) -> str:
    # Typographic apostrophes, as the echoing rule does; same length, so offsets hold.
    return text.replace("\u2019", "'").replace("\u2018", "'")


def _id(pid: str) -> str:
    return rf"(?<!\w){re.escape(pid)}(?!\w)" if pid[:1].isalnum() else re.escape(pid)


def _prefix_pattern(pid: str) -> re.Pattern[str]:
    # "Ana:", "**Ana:**", "**Ana**:", "Ana -", "Ana —" at the start of a line (list bullets and
    # block quotes are not a speaker prefix: a summary or a quotation of what Ana said).
    return re.compile(
        rf"^[ \t]*{_BOLD}[ \t]*(?P<id>{_id(pid)})[ \t]*{_BOLD}[ \t]*(?::(?:\*\*|__)?|[-–—](?=\s))",
        re.IGNORECASE | re.MULTILINE,
    )


def _line_at(text: str, start: int) -> str:
    begin = text.rfind("\n", 0, start) + 1
    end = text.find("\n", start)
    return text[begin : end if end >= 0 else len(text)]


def find_impersonations(text: str, speaker: str, participant_ids: Iterable[str]) -> list[Impersonation]:
    """Every way ``text`` (said by ``speaker``) speaks as another of ``participant_ids``, in
    order of position; ``index`` is 0 (set by the caller for a dialogue)."""
    norm = _normalise(text)
    hits: list[Impersonation] = []
    for pid in participant_ids:
        if not pid or pid.lower() == speaker.lower():
            continue
        for m in _prefix_pattern(pid).finditer(norm):
            first_line = norm[: m.start()].strip() == ""
            hits.append(Impersonation(0, speaker, pid, "prefix" if first_line else "line",
                                      quote(_line_at(text, m.start())), m.start(), m.end()))
        for pattern in _FIRST_PERSON:
            for m in re.finditer(pattern.format(id=_id(pid)), norm, re.IGNORECASE):
                hits.append(Impersonation(0, speaker, pid, "first_person", quote(text[m.start():m.end()]),
                                          m.start(), m.end()))
    return sorted(hits, key=lambda h: (h.start, h.impersonated))


def dialogue_impersonations(dialogue: GroupDialogue) -> list[Impersonation]:
    """Each flagged utterance of ``dialogue`` once: its first hit (earliest in the text)."""
    ids = list(dict.fromkeys([*dialogue.ids, *dialogue.speakers]))
    out = []
    for i, (speaker, text) in enumerate(zip(dialogue.speakers, dialogue.texts, strict=True)):
        hits = find_impersonations(text, speaker, ids)
        if hits:
            h = hits[0]
            out.append(Impersonation(i, h.speaker, h.impersonated, h.kind, h.evidence, h.start, h.end))
    return out


@dataclass(frozen=True)
class PairEcho:
    """How much ``speaker`` repeats ``source``: the highest copy share over its utterances."""

    speaker: str
    source: str
    score: float
    index: int | None  # the utterance with that share (None: the speaker never copied from it)
    span: str  # the longest copied run of words, quoted from the utterance

    @property
    def relays(self) -> bool:
        return self.score >= ECHO_THRESHOLD


def pair_echoing(speakers: Sequence[str], texts: Sequence[str],
                 participant_ids: Iterable[str] = ()) -> dict[tuple[str, str], PairEcho]:
    """The echoing rule's copy signal for every ordered pair (speaker, source) of participants.

    For an utterance u of i, the copied 3-grams from j are the content 3-grams of u that j said
    first in the dialogue or that j's latest utterance before u contains (so a mutual repetition
    loop counts, and j quoting back a phrase i introduced does not make i a copier). Utterances
    with fewer than three content 3-grams score 0, as in the two-party rule.
    """
    ids = list(dict.fromkeys([*participant_ids, *speakers]))
    tokens = [_tokens(t) for t in texts]
    grams = [set(_content_trigrams(tok)) for tok in tokens]
    origin: dict[tuple[str, str, str], str] = {}
    latest: dict[str, int] = {}
    best: dict[tuple[str, str], PairEcho] = {
        (i, j): PairEcho(i, j, 0.0, None, "") for i in ids for j in ids if i != j
    }
    for u, speaker in enumerate(speakers):
        mine = grams[u]
        for source in ids:
            if source == speaker:
                continue
            just_said = grams[latest[source]] if source in latest else set()
            copied = {g for g in mine if origin.get(g) == source or g in just_said}
            share = len(copied) / len(mine) if len(mine) >= 3 else 0.0
            if share > best[(speaker, source)].score:
                span = _longest_copied_span(texts[u], tokens[u], copied)
                best[(speaker, source)] = PairEcho(speaker, source, round(share, 4), u, span)
        for g in mine:
            origin.setdefault(g, speaker)
        latest[speaker] = u
    return best


@dataclass(frozen=True)
class Address:
    """A participant named in an utterance, and whether it spoke within the next k utterances."""

    index: int
    speaker: str
    addressee: str
    #: True: it spoke within the window; False: silent; None: the dialogue ended first.
    answered: bool | None


def _addresses(text: str, pid: str) -> bool:
    for m in re.finditer(rf"(?<![\w@])(@?){_id(pid)}", text, re.IGNORECASE):
        found = text[m.start() + len(m.group(1)) : m.end()]
        # "@ana" in any case; a bare word when written as the id or capitalised ("Will", not "will").
        if m.group(1) or found == pid or found[:1].isupper():
            return True
    return False


def silences(speakers: Sequence[str], texts: Sequence[str], participant_ids: Sequence[str],
             k: int | None = None) -> list[Address]:
    """Every (utterance, addressee) where another participant is named, with its answer.

    A participant's id used as a speaker label (``Ben:`` at the start of a line, see
    :func:`find_impersonations`) does not address it. ``k`` defaults to the number of
    participants. An address whose window runs past the end of the dialogue and that was not
    answered before the end is ``answered=None`` (not counted as silence: the addressee had no
    full window to answer in).
    """
    ids = list(participant_ids)
    window = k if k is not None else len(ids)
    out = []
    for i, (speaker, text) in enumerate(zip(speakers, texts, strict=True)):
        norm = _normalise(text)
        for pid in ids:
            # A speaker label ("Ben:" written by another) is impersonation, not an address.
            if pid == speaker or not _addresses(_prefix_pattern(pid).sub("", norm), pid):
                continue
            after = speakers[i + 1 : i + 1 + window]
            answered: bool | None = True if pid in after else (False if len(after) == window else None)
            out.append(Address(i, speaker, pid, answered))
    return out


@dataclass(frozen=True)
class Loop:
    """The longest run of utterances in which only two participants alternate."""

    length: int
    start: int
    pair: tuple[str, str] | None  # in order of first speaking; None when no two alternate


def longest_alternation(speakers: Sequence[str]) -> Loop:
    """The longest A B A B … run of ``speakers`` (a participant speaking twice in a row, or a
    third one, ends a run; a run of two utterances is the shortest)."""
    best = Loop(min(len(speakers), 1), 0, None)
    run, start = 1, 0
    for t in range(1, len(speakers)):
        if speakers[t] == speakers[t - 1]:
            run, start = 1, t
        elif run >= 2 and speakers[t] == speakers[t - 2]:
            run += 1
        else:
            run, start = 2, t - 1
        if run > best.length:
            best = Loop(run, start, (speakers[start], speakers[start + 1]))
    return best


def seat_drift(
    dialogues: Sequence[GroupDialogue],
    personas: Mapping[str, Persona],
    embed: Embed,
    own: Mapping[str, Sequence[str | None]] | None = None,
) -> dict[tuple[str, str], dict[str, float]]:
    """Cheap-mode drift of every client seat: (dialogue_id, participant_id) -> dimension -> the
    mean over the seat's utterances t >= 1 (NaN for a seat that spoke once or never).

    The drift metric takes one Client's utterances and persona; each seat is handed to it as
    its own conversation (its utterances only, its persona id): a seat drifts as a Client does.
    ``own``: drift on own content instead (:mod:`spasm.evaluation.owncontent`): per dialogue,
    per utterance, the text to embed, ``None`` for an utterance left out (its turn is missing).
    """
    seats: list[Conversation] = []
    keys: dict[str, tuple[str, str]] = {}
    texts: dict[str, list[str | None]] = {}
    for d in dialogues:
        said: Sequence[str | None] = d.texts if own is None else own.get(d.dialogue_id, d.texts)
        for p in d.participants:
            if p.role != "client":
                continue
            mine = [t for s, t in zip(d.speakers, said, strict=True) if s == p.participant_id]
            if not mine:
                continue
            key = f"{d.dialogue_id}\x1f{p.participant_id}"
            keys[key] = (d.dialogue_id, p.participant_id)
            texts[key] = mine
            seats.append(Conversation(key, p.persona_id or "", 0, d.condition, d.pairing, "",
                                      tuple("client" for _ in mine), tuple(t or "" for t in mine)))
    if not seats:
        return {}
    flat = [t for c in seats for t in texts[c.dialogue_id] if t is not None]
    if not flat:  # every seat's utterances were left out of own content
        return {keys[c.dialogue_id]: dict.fromkeys(DRIFT_DIMENSIONS, math.nan) for c in seats}
    matrix = embed(flat)
    vectors: dict[str, FloatArray] = {}
    row = 0
    for c in seats:
        rows = texts[c.dialogue_id]
        kept = [t is not None for t in rows]
        block = np.full((len(rows), matrix.shape[1]), np.nan, dtype=np.float32)
        block[kept] = matrix[row : row + sum(kept)]
        vectors[c.dialogue_id] = block
        row += sum(kept)
    means = dialogue_means(cheap_drift(seats, vectors, personas, embed))
    return {keys[k]: v for k, v in means.items()}
