"""The group stage: role confusion in the group dialogues of a run (docs/evaluation.md, "Group
dialogues"), from the detectors of :mod:`spasm.evaluation.group_detectors`.

:func:`group_stage` runs them on every group dialogue of a run (a run with a ``participants``
table, read by :func:`spasm.evaluation.loader.load_group_dialogues`) and returns the
per-dialogue columns, one row per participant, one row per ordered pair (the pairwise echo),
and the aggregates by condition with 95% intervals. The two-party drift, echoing and
separability leave group dialogues out (:func:`two_party_note` says so in metrics.json and the
report).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from spasm.dataset.reader import Run
from spasm.evaluation.drift import DRIFT_DIMENSIONS, drift_column
from spasm.evaluation.echoing import quote
from spasm.evaluation.group_detectors import (
    ECHO_THRESHOLD,
    LOOP_MIN,
    Embed,
    dialogue_impersonations,
    longest_alternation,
    pair_echoing,
    seat_drift,
    silences,
)
from spasm.evaluation.loader import Conversation, GroupDialogue, load_group_dialogues
from spasm.evaluation.metrics import (
    GroupExample,
    GroupMetrics,
    GroupParticipantStat,
    GroupRate,
    GroupStat,
)
from spasm.evaluation.owncontent import own_column
from spasm.evaluation.stats import finite, mean_ci, wilson_interval
from spasm.personas.persona import Persona
from spasm.registry import condition_rank

__all__ = [
    "GroupResult",
    "group_stage",
    "two_party_note",
]


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
        row[f"group_{drift_column(dim)}"] = _mean(
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
            **{drift_column(dim): drift.get((d.dialogue_id, pid), {}).get(dim, math.nan)
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
    **{drift_column(dim): f"group_{drift_column(dim)}" for dim in DRIFT_DIMENSIONS},
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
    personas: Mapping[str, Persona],
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
                row[own_column(f"group_{drift_column(dim)}")] = _mean([
                    drift_own.get((d.dialogue_id, p.participant_id), {}).get(dim, math.nan)
                    for p in seats_of])
            for seat in seat_rows:
                mine = drift_own.get((d.dialogue_id, str(seat["participant_id"])), {})
                seat.update({own_column(drift_column(dim)): mine.get(dim, math.nan)
                             for dim in DRIFT_DIMENSIONS})
        rows[d.dialogue_id] = {"condition": d.condition, **row}
        people += seat_rows
        examples += found
        pair_rows += pair_found
    frame = pd.DataFrame.from_dict(rows, orient="index")
    columns = ["dialogue_id", "condition", "pairing", "participant_id", "position", "role", "persona_id",
               "n_utterances", "impersonations", "impersonation_share", "impersonated", "echo_max",
               "relays_from", "addressed", "silences", *(drift_column(d) for d in DRIFT_DIMENSIONS)]
    if drift_own is not None:  # each seat on its own content (owncontent.py)
        columns += [own_column(drift_column(d)) for d in DRIFT_DIMENSIONS]
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
