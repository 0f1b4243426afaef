"""Behavioural-realism diagnostics of the Client side (NeMo User Sim's D1–D4).

Zhou et al. (2026), "Mind the Sim2Real Gap in User Simulation for Agentic Tasks"
(arXiv:2603.11245), found LLM-simulated users more cooperative, more uniform and less
frustrated than people; NeMo User Sim turned four of their features into cheap post-hoc
diagnostics. Each is computed on the Client's utterances of one dialogue, offline, and is
``None`` where it is not defined:

* **front-loading** — the share of the Client's information given in its first turn:
  ``|content words of turn 0| / |content words of all its turns|`` (distinct lower-cased
  words that are not function words). 1.0 means every later turn only repeats what the
  opening said (an "everything upfront" simulator); people reveal detail as they go.
  Needs ≥ 2 Client turns. (NeMo reports the first turn's word count over the mean of the
  later turns; Zhou et al. count task identifiers, which open-ended dialogues lack.)
* **politeness** — the share of Client turns with a politeness marker (:data:`POLITENESS`).
* **verbosity CV** — the coefficient of variation (population sd / mean, as
  ``scipy.stats.variation``) of the Client's turn lengths in words. LLM users are uniform
  (low CV); NeMo User Sim puts real users above 0.5. Needs ≥ 2 turns and a non-empty mean.
* **frustration** — the share of Client turns with a frustration or push-back marker
  (:data:`FRUSTRATION`).

The marker lists are English regular expressions, matched case-insensitively after
typographic apostrophes are normalised; they are screening signals, not classifiers.

A group dialogue has several client seats (:func:`seat_diagnostics`): politeness and
frustration are shares of all their turns together; front-loading and verbosity CV describe
one speaker's sequence of turns, so each seat gets its own and the dialogue the mean over the
seats where it is defined.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from spasm.evaluation.echoing import STOPWORDS
from spasm.evaluation.lexical import word_tokens

__all__ = [
    "FRUSTRATION",
    "POLITENESS",
    "client_diagnostics",
    "front_loading",
    "frustration_fraction",
    "politeness_fraction",
    "seat_diagnostics",
    "verbosity_cv",
]

#: Courtesy formulas (Zhou et al.'s politeness_rate; NeMo's polite markers).
POLITENESS = re.compile(
    r"\b(?:please|pls|thank(?:s| you| u)|thx|appreciate[ds]?|grateful|sorry|apologi[sz]e|"
    r"my apologies|excuse me|pardon(?: me)?|kind of you|would you mind|if you don't mind|"
    r"no worries|much obliged)\b",
    re.IGNORECASE,
)

#: Frustration and push-back (Zhou et al.'s D4 error reaction; NeMo's frustration markers).
FRUSTRATION = re.compile(
    r"\b(?:frustrat(?:ed|ing|ion)|annoy(?:ed|ing)|unacceptable|ridiculous|absurd|useless|"
    r"pointless|(?:not|isn't|wasn't|aren't) (?:very |really |at all )?helpful|"
    r"(?:doesn't|does not|didn't|did not|isn't|is not) help(?:ing)?|"
    r"waste of (?:my )?time|(?:i )?already (?:told|said|explained|asked|tried)|"
    r"you(?:'re| are) not (?:listening|getting it|understanding)|you keep (?:saying|asking|repeating)|"
    r"you asked (?:me )?(?:this|that) already|still (?:not|doesn't|isn't|hasn't|won't|can't)|"
    r"seriously\?|ugh+|come on|fed up|sick of|tired of|give up|terrible|awful|"
    r"can you just|just answer|this is taking)(?!\w)"
    r"|\?!|!!",
    re.IGNORECASE,
)


def _norm(text: str) -> str:
    return text.replace("\u2019", "'").replace("\u2018", "'")


def _front_loading(tokens: Sequence[Sequence[str]]) -> float | None:
    if len(tokens) < 2:
        return None
    sets = [{w for w in tok if w not in STOPWORDS} for tok in tokens]
    everything = set().union(*sets)
    if not everything:
        return None
    return len(sets[0]) / len(everything)


def _verbosity_cv(tokens: Sequence[Sequence[str]]) -> float | None:
    lengths = np.fromiter((len(tok) for tok in tokens), dtype=np.float64, count=len(tokens))
    if lengths.size < 2 or lengths.sum() == 0:
        return None
    # scipy.stats.variation's definition (ddof=0) without its per-call overhead (~1 ms, which
    # would be half of this stage on a release-sized run).
    return float(lengths.std() / lengths.mean())


def front_loading(client_turns: Sequence[str]) -> float | None:
    """Share of the Client's distinct content words already present in its first turn."""
    return _front_loading([word_tokens(t) for t in client_turns])


def _share(turns: Sequence[str], pattern: re.Pattern[str]) -> float | None:
    if not turns:
        return None
    return sum(1 for t in turns if pattern.search(_norm(t))) / len(turns)


def politeness_fraction(client_turns: Sequence[str]) -> float | None:
    """Share of Client turns with at least one politeness marker."""
    return _share(client_turns, POLITENESS)


def frustration_fraction(client_turns: Sequence[str]) -> float | None:
    """Share of Client turns with at least one frustration or push-back marker."""
    return _share(client_turns, FRUSTRATION)


def verbosity_cv(client_turns: Sequence[str]) -> float | None:
    """Coefficient of variation of the Client's turn lengths in words (population sd / mean)."""
    return _verbosity_cv([word_tokens(t) for t in client_turns])


def client_diagnostics(
    client_turns: Sequence[str], tokens: Sequence[Sequence[str]] | None = None
) -> dict[str, float | None]:
    """The four diagnostics of one dialogue's Client turns (``tokens``: their
    :func:`~spasm.evaluation.lexical.word_tokens`, when the caller has them already)."""
    tok = [word_tokens(t) for t in client_turns] if tokens is None else tokens
    return {
        "front_loading": _front_loading(tok),
        "politeness": politeness_fraction(client_turns),
        "verbosity_cv": _verbosity_cv(tok),
        "frustration": frustration_fraction(client_turns),
    }


def _seat_mean(values: Sequence[float | None]) -> float | None:
    defined = [v for v in values if v is not None]
    return sum(defined) / len(defined) if defined else None


def seat_diagnostics(
    seats: Sequence[tuple[Sequence[str], Sequence[Sequence[str]]]],
) -> dict[str, float | None]:
    """The four diagnostics of a group dialogue's client side, from each client seat's turns
    and their :func:`~spasm.evaluation.lexical.word_tokens`: politeness and frustration over
    every seat's turns pooled; front-loading and verbosity CV per seat, averaged over the seats
    where they are defined (``None`` when no seat defines them)."""
    turns = [t for texts, _ in seats for t in texts]
    return {
        "front_loading": _seat_mean([_front_loading(tok) for _, tok in seats]),
        "politeness": politeness_fraction(turns),
        "verbosity_cv": _seat_mean([_verbosity_cv(tok) for _, tok in seats]),
        "frustration": frustration_fraction(turns),
    }
