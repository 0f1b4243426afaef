"""Echoing: did one side abandon its role and mirror the other?

Two ways to decide, per conversation:

rule (default, no LLM)
    Three cheap signals per utterance:

    * ``copy`` — the share of the utterance's content word 3-grams that the *partner*
      introduced earlier in the conversation or used in its previous turn (3-grams made
      only of stopwords do not count; a phrase the speaker introduced counts only when
      the partner has just said it again — a mutual repetition loop);
    * ``mirror`` — cos(utterance, partner's previous turn) − max cos(utterance, the
      speaker's own earlier turns): positive when the utterance sounds more like the
      partner than like the speaker so far;
    * ``cues`` — role-reversal phrases: for the Client, helper talk ("you should",
      "I'd recommend", "have you tried", "here are some", numbered steps, "how can I help
      you", "is there anything else I can help"); for the Responder, help-seeking talk
      ("can you help me", "what should I do", "I'm worried about my").

    ``turn score = max(0.45·min(cues, 3)/3 + 0.35·copy + 0.20·clip(mirror / 0.15, 0, 1),
    copy − 0.1)``; a side's score is the maximum over its turns; the conversation echoes
    when a side's score reaches the threshold (0.5), and ``who`` is the side with the
    higher score. Cues alone (at most 0.45) never suffice: an angry Client's "you should
    fix this" is not echoing unless its words or its voice also came from the partner.
    Parroting (60% or more of an utterance's content 3-grams copied from the partner)
    suffices on its own.
judge (optional, :mod:`spasm.evaluation.judge`)
    an LLM reads the conversation with a written rubric and returns
    ``{echoing, who, evidence}``; malformed replies are re-asked once, then the rule's
    verdict is used and counted as a fallback.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from spasm.evaluation.embeddings import FloatArray
from spasm.evaluation.loader import Conversation

__all__ = [
    "DEFAULT_THRESHOLD",
    "OWN_NGRAM",
    "STOPWORDS",
    "EchoVerdict",
    "Side",
    "TurnSignals",
    "Who",
    "copied_words",
    "quote",
    "role_cues",
    "rule_echoing",
    "without_copied",
]

DEFAULT_THRESHOLD = 0.5
Side = Literal["client", "responder"]
Who = Literal["client", "responder", "none"]

# Weights of the turn score (documented above and in docs/evaluation.md).
W_CUES, W_COPY, W_MIRROR = 0.45, 0.35, 0.20
MAX_CUES = 3
MIRROR_FULL = 0.15
PARROT_OFFSET = 0.1  # copy >= 0.6 reaches the 0.5 threshold on its own

_STOPWORDS = frozenset(
    [
        "a",
        "about",
        "after",
        "again",
        "all",
        "also",
        "am",
        "an",
        "and",
        "any",
        "are",
        "as",
        "at",
        "be",
        "been",
        "before",
        "being",
        "but",
        "by",
        "can",
        "could",
        "did",
        "do",
        "does",
        "doing",
        "don't",
        "for",
        "from",
        "had",
        "has",
        "have",
        "having",
        "he",
        "her",
        "here",
        "hers",
        "him",
        "his",
        "how",
        "i",
        "i'd",
        "i'll",
        "i'm",
        "i've",
        "if",
        "in",
        "into",
        "is",
        "it",
        "it's",
        "its",
        "just",
        "let",
        "me",
        "more",
        "most",
        "my",
        "no",
        "not",
        "now",
        "of",
        "on",
        "once",
        "only",
        "or",
        "other",
        "our",
        "out",
        "over",
        "own",
        "same",
        "she",
        "should",
        "so",
        "some",
        "such",
        "than",
        "that",
        "that's",
        "the",
        "their",
        "them",
        "then",
        "there",
        "these",
        "they",
        "this",
        "those",
        "through",
        "to",
        "too",
        "under",
        "until",
        "up",
        "very",
        "was",
        "we",
        "were",
        "what",
        "when",
        "where",
        "which",
        "while",
        "who",
        "why",
        "will",
        "with",
        "would",
        "you",
        "you're",
        "your",
        "yours",
    ]
)

#: Function words, shared with the realism diagnostics (front-loading counts content words).
STOPWORDS = _STOPWORDS

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")

# Helper talk in the Client's mouth. Each pattern that matches counts as one cue.
_CLIENT_CUES = [
    r"\byou (?:should|must|need to|ought to)\b",
    r"\byou (?:could|might|may) (?:want to |also )?(?:try|consider|look into|start)\b",
    r"\bi(?:'d| would)? (?:strongly )?(?:recommend|suggest|advise)\b",
    r"\bhave you (?:tried|considered|thought about|looked into)\b",
    r"\bhere (?:are|is) (?:some|a few|what|my)\b",
    r"\bmy (?:advice|suggestion|recommendation)\b",
    r"\bhow (?:can|may) i (?:help|assist)\b",
    r"\bis there anything else (?:i|we) can\b",
    r"\b(?:i'd|i would|i'm|i am) (?:be )?(?:happy|glad) to (?:help|assist)\b",
    r"\blet me (?:help|assist|explain|walk you)\b",
    r"\bi understand (?:your|how you|that you)\b",
    r"\bit(?:'s| is) (?:important|essential|crucial|a good idea) to\b",
    r"\bmake sure (?:to|you)\b",
    r"\bfeel free to\b",
    r"\b(?:first|step one)[,:] \w+",
    r"\bsorry for (?:any|the) inconvenience\b",
    r"\bwhat brings you (?:here|in|to)\b",
    r"\bany (?:other )?questions you (?:may|might) have\b",
    r"\b(?:it's|it is) (?:a|always a|my) pleasure to\b",
    r"\bdon't hesitate to\b",
    r"\bthank you for (?:reaching out|contacting|your patience)\b",
    r"\bi hope (?:this|that) helps\b",
]
_RESPONDER_CUES = [
    r"\b(?:can|could) you (?:please )?(?:help|advise) me\b",
    r"\bi need (?:your )?(?:help|advice)\b",
    r"\bwhat should i do\b",
    r"\bi(?:'m| am) (?:so |really |very )?"
    r"(?:worried|anxious|scared|frustrated|stressed) about my\b",
    r"\bmy (?:problem|issue) is\b",
    r"\bi(?:'ve| have) been (?:struggling|dealing) with\b",
    r"\bthanks? (?:you )?(?:so much )?for (?:your|the) (?:help|advice)\b",
]
_CUE_PATTERNS: dict[Side, list[re.Pattern[str]]] = {
    "client": [re.compile(p, re.IGNORECASE) for p in _CLIENT_CUES],
    "responder": [re.compile(p, re.IGNORECASE) for p in _RESPONDER_CUES],
}
_LIST_ITEM = re.compile(r"(?m)^\s*(?:\d+[.)]|[-*\u2022])\s+\S")
_SENTENCE = re.compile(r"[^.!?\n]+[.!?]?")


def _normalise(text: str) -> str:
    # Models often write typographic apostrophes; the patterns use ASCII ones.
    return text.replace("\u2019", "'").replace("\u2018", "'")


def _tokens(text: str) -> list[str]:
    return _WORD.findall(_normalise(text).lower())


def _content_trigrams(tokens: Sequence[str]) -> list[tuple[str, str, str]]:
    grams = [(tokens[i], tokens[i + 1], tokens[i + 2]) for i in range(len(tokens) - 2)]
    return [g for g in grams if not all(w in _STOPWORDS for w in g)]


#: Own content (docs/evaluation.md, "Own content"): a word is copied when it lies in a run of at
#: least this many words that an earlier utterance of the dialogue already contains.
OWN_NGRAM = 4


def _word_spans(text: str) -> tuple[list[str], list[tuple[int, int]], str]:
    """The words of ``text`` as :func:`_tokens` reads them, their character spans, and the text
    the spans index (``text`` itself unless lower-casing changed its length)."""
    normal = _normalise(text)
    low = normal.lower()
    matches = list(_WORD.finditer(low))
    base = text if len(low) == len(text) else low
    return [m.group(0) for m in matches], [m.span() for m in matches], base


def copied_words(texts: Sequence[str], n: int = OWN_NGRAM) -> list[list[bool]]:
    """For every utterance of a dialogue, in order, which of its words (as the rule tokenises
    them) lie in a word ``n``-gram that an earlier utterance — anyone's, the speaker's own too —
    contains. ``n``-grams made only of stopwords never count, as in the copy signal."""
    if n < 1:
        raise ValueError("n must be at least 1")
    seen: set[tuple[str, ...]] = set()
    out: list[list[bool]] = []
    for text in texts:
        tokens = _tokens(text)
        grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
        mask = [False] * len(tokens)
        for i, gram in enumerate(grams):
            if gram in seen and not all(w in _STOPWORDS for w in gram):
                mask[i : i + n] = [True] * n
        out.append(mask)
        seen.update(grams)
    return out


def without_copied(text: str, mask: Sequence[bool]) -> str:
    """``text`` with its copied words (``mask``, from :func:`copied_words`) cut out: each run
    of copied words goes with what follows it up to the next word of its own (punctuation,
    spaces), so ``"Own words. Copied line?"`` keeps ``"Own words."``. Unchanged when nothing
    is copied."""
    if not any(mask):
        return text
    _, spans, base = _word_spans(text)
    pieces: list[str] = []
    cursor = 0
    i = 0
    while i < len(spans):
        if not mask[i]:
            i += 1
            continue
        j = i
        while j + 1 < len(spans) and mask[j + 1]:
            j += 1
        pieces.append(base[cursor : spans[i][0]])
        cursor = spans[j + 1][0] if j + 1 < len(spans) else len(base)
        i = j + 1
    pieces.append(base[cursor:])
    return "".join(pieces).strip()


def role_cues(text: str, side: Side) -> list[str]:
    """The role-reversal phrases found in ``text`` spoken by ``side`` (one per pattern).

    For the Client a list of two or more numbered or bulleted lines counts as one cue.
    """
    found = []
    text = _normalise(text)
    for pattern in _CUE_PATTERNS[side]:
        m = pattern.search(text)
        if m:
            found.append(m.group(0))
    if side == "client" and len(_LIST_ITEM.findall(text)) >= 2:
        found.append("a numbered/bulleted list of steps")
    return found


@dataclass
class TurnSignals:
    """The cheap signals of one utterance."""

    index: int
    speaker: Side
    copy: float
    mirror: float
    cues: list[str]
    score: float
    copied_span: str = ""


@dataclass
class EchoVerdict:
    """The echoing verdict of one conversation."""

    dialogue_id: str
    echoing: bool
    who: Who
    score: float
    client_score: float
    responder_score: float
    evidence: list[str]
    method: Literal["rule", "judge"] = "rule"
    turns: list[TurnSignals] = field(default_factory=list)


def _longest_copied_span(text: str, tokens: Sequence[str], copied: set[tuple[str, str, str]]) -> str:
    """The longest run of copied 3-grams, quoted from ``text`` with its own punctuation."""
    best: tuple[int, int] = (0, 0)
    start = None
    for i in range(len(tokens) - 2):
        hit = (tokens[i], tokens[i + 1], tokens[i + 2]) in copied
        if hit and start is None:
            start = i
        if start is not None and (not hit or i == len(tokens) - 3):
            end = i + 2 if hit else i + 1
            if end - start > best[1] - best[0]:
                best = (start, end)
            start = None
    if best[1] <= best[0]:
        return ""
    spans = [m.span() for m in _WORD.finditer(_normalise(text).lower())]
    return text[spans[best[0]][0] : spans[best[1]][1]]


def quote(text: str, limit: int = 180) -> str:
    """``text`` on one line, cut to ``limit`` characters with an ellipsis (for evidence)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _sentence_with(text: str, phrase: str) -> str:
    low = phrase.lower()
    for sentence in _SENTENCE.findall(text):
        if low in sentence.lower():
            return str(sentence).strip()
    return text


def rule_echoing(
    conv: Conversation,
    vectors: FloatArray,
    *,
    threshold: float = DEFAULT_THRESHOLD,
) -> EchoVerdict:
    """Decide echoing for one conversation from the cheap signals.

    Args:
        conv: the conversation.
        vectors: one L2-normalised embedding per utterance of ``conv``, in order.
        threshold: side score at or above which the conversation counts as echoing.
    """
    tokens = [_tokens(t) for t in conv.texts]
    grams = [set(_content_trigrams(tok)) for tok in tokens]
    # Who said each 3-gram first: a phrase the partner introduced counts as copied even
    # when the speaker has already repeated it (ping-pong loops), one the speaker
    # introduced never does (the partner quoting it back does not make it copied).
    origin: dict[tuple[str, str, str], str] = {}
    own_rows: dict[str, list[int]] = {"client": [], "responder": []}
    signals: list[TurnSignals] = []
    for i, speaker_raw in enumerate(conv.speakers):
        if speaker_raw not in ("client", "responder"):
            continue
        speaker: Side = "client" if speaker_raw == "client" else "responder"
        partner: Side = "responder" if speaker == "client" else "client"
        # Every utterance is scored: cues need nothing before them, copying needs a partner
        # turn before it, mirroring also needs an own earlier turn (a voice to compare with).
        mine = grams[i]
        prev_partner = next((j for j in range(i - 1, -1, -1) if conv.speakers[j] == partner), None)
        just_said = grams[prev_partner] if prev_partner is not None else set()
        copied = {g for g in mine if origin.get(g) == partner or g in just_said}
        copy = len(copied) / len(mine) if len(mine) >= 3 else 0.0
        mirror = 0.0
        if prev_partner is not None and own_rows[speaker]:
            sim_partner = float(vectors[i] @ vectors[prev_partner])
            sim_self = float(np.max(vectors[own_rows[speaker]] @ vectors[i]))
            mirror = sim_partner - sim_self
        cues = role_cues(conv.texts[i], speaker)
        weighted = (
            W_CUES * min(len(cues), MAX_CUES) / MAX_CUES
            + W_COPY * copy
            + W_MIRROR * float(np.clip(mirror / MIRROR_FULL, 0.0, 1.0))
        )
        # Parroting: copying most of the partner's words is echoing by itself.
        score = max(weighted, copy - PARROT_OFFSET)
        signals.append(
            TurnSignals(
                index=i,
                speaker=speaker,
                copy=copy,
                mirror=mirror,
                cues=cues,
                score=score,
                copied_span=_longest_copied_span(conv.texts[i], tokens[i], copied),
            )
        )
        for g in grams[i]:
            origin.setdefault(g, speaker)
        own_rows[speaker].append(i)

    side_score = {
        side: max((s.score for s in signals if s.speaker == side), default=0.0)
        for side in ("client", "responder")
    }
    who: Who = "none"
    best = max(side_score, key=lambda s: side_score[s])
    echoing = side_score[best] >= threshold
    if echoing:
        who = "client" if best == "client" else "responder"
    evidence: list[str] = []
    if echoing:
        flagged = sorted(
            (s for s in signals if s.speaker == who and s.score >= threshold),
            key=lambda s: -s.score,
        )[:3]
        for s in flagged:
            turn_no = conv.speakers[: s.index + 1].count(s.speaker) - 1
            where = f"{s.speaker} turn {turn_no}"
            cue_sentence = _sentence_with(conv.texts[s.index], s.cues[0]) if s.cues else ""
            # Skip the cue sentence when the copied span already quotes it.
            if cue_sentence and cue_sentence.lower().rstrip(".!?") not in s.copied_span.lower():
                evidence.append(f'{where}: "{quote(cue_sentence)}"')
            if s.copied_span and len(s.copied_span.split()) >= 4:
                evidence.append(
                    f"{where} repeats the {'responder' if who == 'client' else 'client'}: "
                    f'"{quote(s.copied_span)}"'
                )
            if not s.cues and not s.copied_span:
                evidence.append(f'{where}: "{quote(conv.texts[s.index])}"')
    return EchoVerdict(
        dialogue_id=conv.dialogue_id,
        echoing=echoing,
        who=who,
        score=round(side_score[best], 4),
        client_score=round(side_score["client"], 4),
        responder_score=round(side_score["responder"], 4),
        evidence=evidence,
        method="rule",
        turns=signals,
    )
