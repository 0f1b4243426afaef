"""Role confusion in group dialogues (docs/evaluation.md, "Group dialogues"): who speaks as
whom, who repeats whom, whose persona drifts, who is ignored, and which two lock the floor.

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

:func:`group_stage` runs them on every group dialogue of a run (a run with a ``participants``
table, read through :func:`spasm.dataset.open_run`) and returns the per-dialogue columns, one
row per participant, one row per ordered pair (the pairwise echo), and the aggregates by
condition with 95% intervals. The two-party drift, echoing and separability leave group
dialogues out (:func:`two_party_note` says so in metrics.json and the report).
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from spasm.dataset.reader import Run, open_run
from spasm.errors import UserError
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
from spasm.evaluation.loader import Conversation, clean_cell, seat_role
from spasm.evaluation.metrics import (
    GroupExample,
    GroupMetrics,
    GroupParticipantStat,
    GroupRate,
    GroupStat,
)
from spasm.evaluation.stats import finite, mean_ci, wilson_interval
from spasm.registry import condition_rank

__all__ = [
    "ECHO_THRESHOLD",
    "LOOP_MIN",
    "Address",
    "GroupDialogue",
    "GroupResult",
    "Impersonation",
    "Loop",
    "PairEcho",
    "Participant",
    "find_impersonations",
    "group_stage",
    "has_participants",
    "load_group_dialogues",
    "longest_alternation",
    "pair_echoing",
    "seat_drift",
    "silences",
    "two_party_note",
]

#: A pair (i, j) relays j's lines when an utterance of i copies this share of its content
#: 3-grams from j: the echoing rule's parroting level (copy − 0.1 reaches its 0.5 threshold).
ECHO_THRESHOLD = DEFAULT_THRESHOLD + PARROT_OFFSET
#: A two-participant alternation this long (utterances), with three or more present, is a loop.
LOOP_MIN = 6

Embed = Callable[[list[str]], FloatArray]


# --------------------------------------------------------------------------- the data


@dataclass(frozen=True)
class Participant:
    """One seat of a group dialogue (a row of the ``participants`` table)."""

    participant_id: str
    position: int
    role: str
    persona_id: str | None = None
    backend: str | None = None
    model: str | None = None
    level: str | None = None


@dataclass(frozen=True)
class GroupDialogue:
    """One group dialogue: its participants in order and its utterances (speaker = participant id)."""

    dialogue_id: str
    condition: str
    pairing: str
    participants: tuple[Participant, ...]
    speakers: tuple[str, ...]
    texts: tuple[str, ...]

    @property
    def ids(self) -> list[str]:
        """The participant ids in seat order."""
        return [p.participant_id for p in self.participants]

    def participant(self, participant_id: str) -> Participant | None:
        return next((p for p in self.participants if p.participant_id == participant_id), None)

    @property
    def persona_set(self) -> str:
        """The client seats' persona ids, sorted and joined with ``+`` (the pairing key of twins)."""
        ids = sorted(p.persona_id for p in self.participants if p.role == "client" and p.persona_id)
        return "+".join(ids)


# --------------------------------------------------------------------------- impersonation


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


# --------------------------------------------------------------------------- echoing


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


# --------------------------------------------------------------------------- silence


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


# --------------------------------------------------------------------------- loops


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


# --------------------------------------------------------------------------- drift per seat


def seat_drift(
    dialogues: Sequence[GroupDialogue],
    personas: Mapping[str, Mapping[str, object]],
    embed: Embed,
    own: Mapping[str, Sequence[str | None]] | None = None,
) -> dict[tuple[str, str], dict[str, float]]:
    """Cheap-mode drift of every client seat: (dialogue_id, participant_id) -> dimension -> the
    mean over the seat's utterances t >= 1 (NaN for a seat that spoke once or never).

    The drift metric takes one Client's utterances and persona; each seat is handed to it as
    its own conversation (its utterances only, its persona id), so the definition is unchanged.
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


# --------------------------------------------------------------------------- reading a run


_PARTICIPANT_COLUMNS = ("dialogue_id", "participant_id")


def has_participants(run_dir: str | Path | Run) -> bool:
    """Whether the run is a group run (it has a ``participants`` table)."""
    run = run_dir if isinstance(run_dir, Run) else open_run(run_dir, verify=False)
    return run.has("participants")


def load_group_dialogues(run_dir: str | Path | Run,
                         conversations: Sequence[Conversation]) -> list[GroupDialogue] | None:
    """The group dialogues among ``conversations`` (the ok dialogues :func:`load_run` read),
    their speakers as stored (participant ids), or ``None`` for a run without participants.

    A dialogue without participant rows is not a group dialogue and is left out.

    Raises:
        UserError: the participants table lacks ``dialogue_id`` or ``participant_id``.
    """
    run = run_dir if isinstance(run_dir, Run) else open_run(run_dir, verify=False)
    if not run.has("participants"):
        return None
    stored = run.stored_columns("participants")
    missing = [c for c in _PARTICIPANT_COLUMNS if c not in stored]
    if missing:
        raise UserError(
            f"{run.dir / 'participants.parquet'} lacks the column(s) {', '.join(missing)}; a group "
            "run's participants table needs at least dialogue_id and participant_id."
        )
    table = run.df("participants")
    wanted = {c.dialogue_id for c in conversations}
    seats: dict[str, list[Participant]] = defaultdict(list)
    for n, r in enumerate(table.to_dict("records")):
        did, pid = clean_cell(r.get("dialogue_id")), clean_cell(r.get("participant_id"))
        if did is None or pid is None or did not in wanted:
            continue
        position = pd.to_numeric(pd.Series([r.get("position")]), errors="coerce").iloc[0]
        persona = clean_cell(r.get("persona_id"))
        role = seat_role(r.get("role"), persona)
        seats[did].append(Participant(pid, int(position) if pd.notna(position) else n, role, persona,
                                      clean_cell(r.get("backend")), clean_cell(r.get("model")),
                                      clean_cell(r.get("level"))))
    turns = run.df("turns", ["dialogue_id", "turn_index", "speaker", "text"])
    turns = turns[turns["dialogue_id"].astype(str).isin(seats)].copy()
    turns["dialogue_id"] = turns["dialogue_id"].astype(str)
    turns["speaker"] = turns["speaker"].fillna("").astype(str)
    turns["text"] = turns["text"].fillna("").astype(str)
    turns = turns.sort_values(["dialogue_id", "turn_index"], kind="stable")
    by_dialogue = {str(k): g for k, g in turns.groupby("dialogue_id", sort=False)}
    out = []
    for conv in conversations:
        members = seats.get(conv.dialogue_id)
        group = by_dialogue.get(conv.dialogue_id)
        if not members or group is None:
            continue
        members = sorted({p.participant_id: p for p in members}.values(), key=lambda p: p.position)
        canonical = {p.participant_id.lower(): p.participant_id for p in members}
        speakers = tuple(canonical.get(s.lower(), s) for s in group["speaker"].tolist())
        out.append(GroupDialogue(conv.dialogue_id, conv.condition, conv.pairing, tuple(members),
                                 speakers, tuple(group["text"].tolist())))
    return out


# --------------------------------------------------------------------------- the stage


#: The columns of ``per_pair.parquet`` (:attr:`GroupResult.per_pair`).
PAIR_COLUMNS: tuple[str, ...] = ("dialogue_id", "condition", "pairing", "participant_id", "source_id",
                                 "score", "relays", "turn_index")


@dataclass
class GroupResult:
    """What :func:`group_stage` computes: the aggregates, and the rows behind them."""

    metrics: GroupMetrics
    per_dialogue: pd.DataFrame  # indexed by dialogue_id; the group_* columns
    per_participant: pd.DataFrame  # one row per (dialogue, participant)
    #: One row per (dialogue, ordered pair of participants): how much ``participant_id``
    #: copies ``source_id`` (:func:`pair_echoing`'s score, whether it relays, the utterance).
    per_pair: pd.DataFrame


DEFINITIONS: dict[str, str] = {
    "impersonation": "share of utterances that speak as another participant (its id and ':' or "
                     "'**Id:**' or 'Id -' at the start of a line; 'I'm <Id>', 'As <Id>, I', 'my name "
                     "is <Id>')",
    "echo": f"max over ordered pairs (i, j) of the share of an utterance of i's content 3-grams that "
            f"j said first or just said; a pair relays at >= {ECHO_THRESHOLD:g}",
    "drift": "cheap drift per client seat (its utterances vs its opening utterance and its persona), "
             "averaged over the dialogue's client seats",
    "silence": "share of addresses (a participant's id as a word or @id) not answered by the "
               "addressee within the next k utterances (k = participants); addresses the dialogue "
               "ends before answering are left out",
    "loop": f"longest run of utterances where only two participants alternate; a loop when >= "
            f"{LOOP_MIN} with 3 or more participants",
}


def _mean(values: Sequence[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else math.nan


def _dialogue_row(d: GroupDialogue, drift: Mapping[tuple[str, str], Mapping[str, float]]
                  ) -> tuple[dict[str, object], list[dict[str, object]], list[GroupExample],
                             list[dict[str, object]]]:
    n = len(d.texts)
    ids = list(dict.fromkeys([*d.ids, *d.speakers]))
    hits = dialogue_impersonations(d)
    pairs = pair_echoing(d.speakers, d.texts, ids)
    relays = sorted((p for p in pairs.values() if p.relays), key=lambda p: (-p.score, p.speaker, p.source))
    addresses = silences(d.speakers, d.texts, ids)
    decided = [a for a in addresses if a.answered is not None]
    silent = [a for a in decided if a.answered is False]
    loop = longest_alternation(d.speakers)
    n_seats = len(ids)
    row: dict[str, object] = {
        "group_n_participants": n_seats,
        "persona_set": d.persona_set or None,
        "group_impersonation": bool(hits),
        "group_impersonation_share": len(hits) / n if n else math.nan,
        "group_impersonation_evidence": " | ".join(
            f"turn {h.index} {h.speaker} as {h.impersonated}: \"{h.evidence}\"" for h in hits[:5]),
        "group_echo": bool(relays),
        "group_echo_max": max((p.score for p in pairs.values()), default=0.0),
        "group_echo_pairs": "; ".join(f"{p.speaker}<-{p.source} {p.score:.2f}" for p in relays),
        "group_silence": bool(silent),
        "group_silences": len(silent),
        "group_silence_rate": len(silent) / len(decided) if decided else math.nan,
        "group_loop": n_seats >= 3 and loop.length >= LOOP_MIN,
        "group_loop_longest": loop.length,
        "group_loop_pair": "/".join(loop.pair) if loop.pair else "",
    }
    seats = [p for p in d.participants if p.role == "client"]
    for dim in DRIFT_DIMENSIONS:
        row[f"group_drift_{dim}"] = _mean(
            [drift.get((d.dialogue_id, p.participant_id), {}).get(dim, math.nan) for p in seats])
    people: list[dict[str, object]] = []
    for pid in ids:
        seat = d.participant(pid)
        said = sum(s == pid for s in d.speakers)
        mine = [h for h in hits if h.speaker == pid]
        people.append({
            "dialogue_id": d.dialogue_id,
            "condition": d.condition,
            "pairing": d.pairing,
            "participant_id": pid,
            "position": seat.position if seat else None,
            "role": seat.role if seat else "unknown",
            "persona_id": seat.persona_id if seat else None,
            "n_utterances": said,
            "impersonations": len(mine),
            "impersonation_share": len(mine) / said if said else math.nan,
            "impersonated": ", ".join(sorted({h.impersonated for h in mine})),
            "echo_max": max((p.score for (i, _), p in pairs.items() if i == pid), default=0.0),
            "relays_from": ", ".join(p.source for p in relays if p.speaker == pid),
            "addressed": sum(a.addressee == pid for a in decided),
            "silences": sum(a.addressee == pid for a in silent),
            **{f"drift_{dim}": drift.get((d.dialogue_id, pid), {}).get(dim, math.nan)
               for dim in DRIFT_DIMENSIONS},
        })
    examples = [
        GroupExample(kind="impersonation", dialogue_id=d.dialogue_id, condition=d.condition,
                     turn_index=h.index, participant=h.speaker, other=h.impersonated,
                     evidence=h.evidence)
        for h in hits[:3]
    ] + [
        GroupExample(kind="echo", dialogue_id=d.dialogue_id, condition=d.condition, turn_index=p.index,
                     participant=p.speaker, other=p.source, evidence=quote(p.span), score=p.score)
        for p in relays[:3]
    ] + [
        GroupExample(kind="silence", dialogue_id=d.dialogue_id, condition=d.condition,
                     turn_index=a.index, participant=a.addressee, other=a.speaker,
                     evidence=quote(d.texts[a.index]))
        for a in silent[:3]
    ]
    if row["group_loop"] and loop.pair:
        examples.append(GroupExample(kind="loop", dialogue_id=d.dialogue_id, condition=d.condition,
                                     turn_index=loop.start, participant=loop.pair[0],
                                     other=loop.pair[1], evidence=f"{loop.length} utterances",
                                     score=float(loop.length)))
    pair_rows: list[dict[str, object]] = [
        {"dialogue_id": d.dialogue_id, "condition": d.condition, "pairing": d.pairing,
         "participant_id": p.speaker, "source_id": p.source, "score": p.score, "relays": p.relays,
         "turn_index": p.index}
        for p in pairs.values()
    ]
    return row, people, examples, pair_rows


_RATE_COLUMNS = {"impersonation": "group_impersonation", "echo": "group_echo",
                 "silence": "group_silence", "loop": "group_loop"}
_MEAN_COLUMNS = {
    "impersonation_share": "group_impersonation_share",
    "echo_max": "group_echo_max",
    "silence_rate": "group_silence_rate",
    "loop_longest": "group_loop_longest",
    **{f"drift_{dim}": f"group_drift_{dim}" for dim in DRIFT_DIMENSIONS},
}


def _conditions(frame: pd.DataFrame) -> list[str]:
    return sorted(set(frame["condition"].astype(str)), key=condition_rank)


def _aggregate(dialogues: pd.DataFrame, people: pd.DataFrame, examples: list[GroupExample],
               n_dialogues: int) -> GroupMetrics:
    rates, stats, by_participant = [], [], []
    for cond in ["all", *_conditions(dialogues)]:
        rows = dialogues if cond == "all" else dialogues[dialogues["condition"] == cond]
        for name, column in _RATE_COLUMNS.items():
            flags = [bool(v) for v in rows[column]]
            k = sum(flags)
            low, high = wilson_interval(k, len(flags))
            rates.append(GroupRate(metric=name, condition=cond, n=len(flags), n_flagged=k,
                                   rate=k / len(flags) if flags else None,
                                   ci_low=finite(low), ci_high=finite(high)))
        for name, column in _MEAN_COLUMNS.items():
            mean, low, high, n = mean_ci([float(v) for v in rows[column]])
            stats.append(GroupStat(metric=name, condition=cond, n=n, mean=finite(mean),
                                   ci_low=finite(low), ci_high=finite(high)))
    for keys, rows in people.groupby(["participant_id", "role", "condition"], sort=False):
        pid, role, cond = (str(k) for k in keys)
        share = mean_ci([float(v) for v in rows["impersonation_share"]])
        drift = mean_ci([float(v) for v in rows["drift_utterance"]])
        by_participant.append(GroupParticipantStat(
            participant_id=pid, role=role, condition=cond, n_dialogues=len(rows),
            n_utterances=int(rows["n_utterances"].sum()), impersonations=int(rows["impersonations"].sum()),
            impersonation_share=finite(share[0]), impersonation_ci_low=finite(share[1]),
            impersonation_ci_high=finite(share[2]), addressed=int(rows["addressed"].sum()),
            silences=int(rows["silences"].sum()), echo_max=finite(_mean(list(rows["echo_max"]))),
            drift_utterance=finite(drift[0]),
        ))
    by_participant.sort(key=lambda s: (*condition_rank(s.condition), s.participant_id))
    order = {"impersonation": 0, "echo": 1, "silence": 2, "loop": 3}
    examples = sorted(examples, key=lambda e: (order[e.kind], -(e.score or 0), e.dialogue_id,
                                               e.turn_index or 0))
    kept: list[GroupExample] = []
    for kind in order:
        kept += [e for e in examples if e.kind == kind][:10]
    return GroupMetrics(
        dialogues=n_dialogues,
        participants_max=int(dialogues["group_n_participants"].max()) if len(dialogues) else 0,
        echo_threshold=ECHO_THRESHOLD,
        loop_min=LOOP_MIN,
        definitions=DEFINITIONS,
        rates=rates,
        stats=stats,
        by_participant=by_participant,
        examples=kept,
    )


def group_stage(
    run_dir: str | Path | Run,
    conversations: Sequence[Conversation],
    personas: Mapping[str, Mapping[str, object]],
    embed: Embed,
    own: Mapping[str, Sequence[str | None]] | None = None,
) -> GroupResult | None:
    """Every group detector on the group dialogues of a run; ``None`` for a two-party run.

    ``own``: each dialogue's utterances on own content (:func:`seat_drift`), for the seat drift
    on own content (``group_drift_<dimension>_own``)."""
    dialogues = load_group_dialogues(run_dir, conversations)
    if dialogues is None:
        return None
    drift = seat_drift(dialogues, personas, embed)
    drift_own = seat_drift(dialogues, personas, embed, own) if own is not None else None
    rows, people, examples, pair_rows = {}, [], [], []
    for d in dialogues:
        row, seat_rows, found, pair_found = _dialogue_row(d, drift)
        if drift_own is not None:  # each client seat on its own content, beside the raw drift
            seats_of = [p for p in d.participants if p.role == "client"]
            for dim in DRIFT_DIMENSIONS:
                row[f"group_drift_{dim}_own"] = _mean([
                    drift_own.get((d.dialogue_id, p.participant_id), {}).get(dim, math.nan)
                    for p in seats_of])
            for seat in seat_rows:
                mine = drift_own.get((d.dialogue_id, str(seat["participant_id"])), {})
                seat.update({f"drift_{dim}_own": mine.get(dim, math.nan) for dim in DRIFT_DIMENSIONS})
        rows[d.dialogue_id] = {"condition": d.condition, **row}
        people += seat_rows
        examples += found
        pair_rows += pair_found
    frame = pd.DataFrame.from_dict(rows, orient="index")
    columns = ["dialogue_id", "condition", "pairing", "participant_id", "position", "role", "persona_id",
               "n_utterances", "impersonations", "impersonation_share", "impersonated", "echo_max",
               "relays_from", "addressed", "silences", *(f"drift_{d}" for d in DRIFT_DIMENSIONS)]
    if drift_own is not None:  # each seat on its own content (owncontent.py)
        columns += [f"drift_{d}_own" for d in DRIFT_DIMENSIONS]
    seats = pd.DataFrame(people, columns=columns)
    seats["position"] = seats["position"].astype("Int64")
    if frame.empty:
        frame = pd.DataFrame(columns=["condition"])
    metrics = _aggregate(frame, seats, examples, len(dialogues)) if len(frame) else GroupMetrics(
        dialogues=0, participants_max=0, echo_threshold=ECHO_THRESHOLD, loop_min=LOOP_MIN,
        definitions=DEFINITIONS, rates=[], stats=[], by_participant=[], examples=[],
        notes=["The run has a participants table but none of its ok dialogues has participants."])
    if dialogues:
        metrics.notes.append(two_party_note(len(dialogues), len(conversations) - len(dialogues)))
    pair_frame = pd.DataFrame(pair_rows, columns=list(PAIR_COLUMNS))
    pair_frame["score"] = pair_frame["score"].astype(float)
    pair_frame["relays"] = pair_frame["relays"].astype(bool)
    pair_frame["turn_index"] = pair_frame["turn_index"].astype("Int64")
    return GroupResult(metrics, frame.drop(columns=["condition"]), seats, pair_frame)


def two_party_note(n_group: int, n_two_party: int) -> str:
    """What the two-party metrics say about a run's group dialogues (metrics.json and the report)."""
    rest = (f"they cover the run's {n_two_party} two-party dialogue(s) only" if n_two_party
            else "they are empty for this run")
    return (
        f"Drift, echoing and persona separability compare one Client with one Responder, so the "
        f"{n_group} group dialogue(s) are left out of them ({rest}) and measured by the group metrics "
        "instead (metrics.group): drift per client seat (group_drift_*), echoing per ordered pair of "
        "participants (group_echo*, per_pair.parquet); persona separability has no group form yet. "
        "Realism and language compliance count every client seat as the client side and every "
        "responder seat as the responder side (turns.role)."
    )
