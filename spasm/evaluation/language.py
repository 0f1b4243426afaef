"""Language compliance: utterances written in another language than the persona's.

The identifier and its thresholds are :mod:`spasm.language`'s (one owner: the export's
``off_language`` QA scan calls the same). Each utterance long enough to classify (at least
:data:`MIN_LETTERS` letters) goes through an offline language identifier — ``py3langid``, the
maintained fork of langid.py (Lui & Baldwin, 2012), whose naive-Bayes model over byte n-grams
ships inside the package (97 languages, numpy only, ~0.1 ms an utterance). It is **flagged**
when the identified language is not the expected one with a normalised probability of at
least :data:`MIN_CONFIDENCE`.

The expected language is the persona's ``language`` field when the personas table has one
(an ISO 639-1 code such as ``en``, a tag such as ``en-GB``, or an English name such as
``Spanish``), else English. Per dialogue and side: ``language_compliance_<side>`` = share of
the classified utterances that are not flagged, ``off_language_<side>`` = how many are.

In a group dialogue the sides are roles (``turns.role``): every client seat's utterances are
the client side, each checked against its own seat's persona, and every responder seat's the
responder side, checked against the dialogue's persona (``dialogues.persona_id``) as in a
two-party dialogue; a flag names the participant.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from spasm.evaluation.echoing import quote
from spasm.evaluation.loader import Conversation
from spasm.evaluation.metrics import LanguageFlag, LanguageMetrics, LanguageStat
from spasm.evaluation.stats import finite, mean_ci
from spasm.evaluation.summary import group_key
from spasm.language import (
    DEFAULT_LANGUAGE,
    MIN_CONFIDENCE,
    MIN_LETTERS,
    detect,
    expected_language,
    is_off_language,
)
from spasm.personas.persona import Persona

__all__ = [
    "DEFAULT_LANGUAGE",
    "MIN_CONFIDENCE",
    "MIN_LETTERS",
    "detect",
    "expected_language",
    "language_metrics",
    "language_rows",
    "language_scan",
]

EXAMPLES = 20
SIDES = ("client", "responder")


@dataclass
class _Side:
    classified: int = 0
    flagged: int = 0


def _language(persona: Persona | None) -> str | None:
    """A persona's language field (``None``: no such persona, or no such field)."""
    return persona.language if persona else None


def language_scan(
    conversations: Sequence[Conversation], personas: Mapping[str, Persona]
) -> tuple[LanguageMetrics, dict[str, dict[str, object]]]:
    """Flag off-language utterances; the metrics and each dialogue's columns."""
    per_dialogue, flags = language_rows(conversations, personas)
    return language_metrics(conversations, per_dialogue, flags), per_dialogue


def language_rows(
    conversations: Sequence[Conversation], personas: Mapping[str, Persona]
) -> tuple[dict[str, dict[str, object]], list[LanguageFlag]]:
    """Each dialogue's columns and its flagged utterances, in dialogue order: the part of
    :func:`language_scan` that reads the texts (``spasm eval --ray`` runs it per shard of the
    dialogues and hands the shards' rows, in order, to :func:`language_metrics`)."""
    per_dialogue: dict[str, dict[str, object]] = {}
    flags: list[LanguageFlag] = []
    for conv in conversations:
        expected = expected_language(_language(personas.get(conv.persona_id)))
        seat_personas = conv.seat_personas or (None,) * len(conv.texts)
        sides = {side: _Side() for side in SIDES}
        for index, (speaker, side, seat_persona, text) in enumerate(
            zip(conv.speakers, conv.sides, seat_personas, conv.texts, strict=True)
        ):
            if side not in sides:
                continue
            lang, prob = detect(text)
            if lang is None:
                continue
            # A client seat of a group dialogue speaks its own persona's language.
            wanted = (
                expected_language(_language(personas.get(seat_persona)))
                if side == "client" and seat_persona is not None
                else expected
            )
            sides[side].classified += 1
            if is_off_language(lang, prob, wanted):
                sides[side].flagged += 1
                flags.append(
                    LanguageFlag(
                        dialogue_id=conv.dialogue_id, turn_index=index, speaker=speaker,
                        expected=wanted, detected=lang, probability=round(prob, 4), text=quote(text),
                    )
                )
        if conv.is_group:  # every language one of its seats is expected to speak, "+"-joined
            seats = {p for p, side in zip(seat_personas, conv.sides, strict=True) if p and side == "client"}
            expected = "+".join(sorted({
                expected, *(expected_language(_language(personas.get(p))) for p in seats)}))
        row: dict[str, object] = {"language_expected": expected}
        for side, s in sides.items():
            row[f"language_compliance_{side}"] = 1 - s.flagged / s.classified if s.classified else None
            row[f"off_language_{side}"] = s.flagged
        per_dialogue[conv.dialogue_id] = row
    return per_dialogue, flags


def language_metrics(
    conversations: Sequence[Conversation],
    per_dialogue: Mapping[str, Mapping[str, object]],
    flags: Sequence[LanguageFlag],
) -> LanguageMetrics:
    """The metrics of :func:`language_rows`' columns and flags (every flag, in dialogue order)."""
    ranked = sorted(flags, key=lambda f: -f.probability)  # stable: ties keep dialogue order
    return LanguageMetrics(
        identifier="py3langid",
        min_letters=MIN_LETTERS,
        min_confidence=MIN_CONFIDENCE,
        expected=sorted({code for r in per_dialogue.values()
                         for code in str(r["language_expected"]).split("+")}),
        n_flagged=len(flags),
        stats=_stats(conversations, per_dialogue),
        flagged=ranked[:EXAMPLES],
    )


def _stats(
    conversations: Sequence[Conversation], per_dialogue: Mapping[str, Mapping[str, object]]
) -> list[LanguageStat]:
    groups: dict[tuple[str, str], list[Conversation]] = {}
    for c in conversations:
        groups.setdefault((c.pairing, c.condition), []).append(c)
    scopes = [(("all", "all"), list(conversations)), *sorted(groups.items(), key=group_key)]
    out = []
    for (pairing, condition), members in scopes:
        for side in SIDES:
            values = [
                float(v)
                for c in members
                if isinstance(v := per_dialogue[c.dialogue_id][f"language_compliance_{side}"], float | int)
            ]
            mean, low, high, n = mean_ci(values)
            off = sum(int(per_dialogue[c.dialogue_id][f"off_language_{side}"]) for c in members)  # type: ignore[call-overload]
            out.append(
                LanguageStat(
                    side=side, pairing=pairing, condition=condition, n=n, mean=finite(mean),
                    ci_low=finite(low), ci_high=finite(high), off_language=off,
                )
            )
    return out
