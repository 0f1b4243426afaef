"""Own content: what a Client wrote itself, once the spans it copied are taken out.

A Client that copies the transcript stays close to its own opening and to its persona's
words, so raw drift and separability reward the failure echoing measures. Every persona
metric is therefore also computed on *own content* (docs/evaluation.md, "Own content"),
beside the raw value, never instead of it:

* a word of a Client utterance is **copied** when it lies in a word n-gram (n >=
  :data:`~spasm.evaluation.echoing.OWN_NGRAM`, 4 by default) that an earlier utterance of the
  same dialogue contains — the partner's or the Client's own (the echoing stage's tokens and
  stopwords: :func:`spasm.evaluation.echoing.copied_words`; n-grams of stopwords only never
  count);
* its **own content** is the utterance with every run of copied words cut out
  (:func:`spasm.evaluation.echoing.without_copied`); an utterance with nothing copied is its
  own content unchanged, so a dialogue without copying has own-content values equal to the
  raw ones;
* an utterance left with fewer than ``min_words`` words of its own (default
  :data:`OWN_MIN_WORDS`) after something was cut is **left out**: its drift is missing at that
  turn, and it adds nothing to the conversation's embedding. When the opening is left out, the
  ``utterance`` dimension (anchored on it) is missing for the whole dialogue.

Own-content texts are embedded by the evaluation's own embedder and cache; an unchanged
utterance reuses its raw vector. In a group dialogue each client seat is taken on its own
content (the group stage's seat drift, ``group_drift_<dimension>_own``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from spasm.evaluation.drift import DRIFT_DIMENSIONS, DriftSeries, drift_column
from spasm.evaluation.echoing import OWN_NGRAM, copied_words, without_copied
from spasm.evaluation.embeddings import FloatArray
from spasm.evaluation.loader import Conversation
from spasm.evaluation.metrics import OwnContentMetrics, OwnContentStat
from spasm.evaluation.stats import finite, mean_ci
from spasm.registry import ordered_conditions

__all__ = [
    "OWN_MIN_WORDS",
    "OWN_SUFFIX",
    "OwnContent",
    "OwnRule",
    "OwnUtterance",
    "own_column",
    "own_content",
    "own_conversations",
    "own_metrics",
    "own_texts",
    "own_vectors",
    "per_turn_frame",
]

#: An utterance something was cut from is left out when fewer words than this remain.
OWN_MIN_WORDS = 4
#: A metric's own-content column: the raw column with this suffix.
OWN_SUFFIX = "_own"

Embed = Callable[[list[str]], FloatArray]


def own_column(metric: str) -> str:
    """The own-content counterpart of a per-dialogue column (``drift_utterance`` ->
    ``drift_utterance_own``)."""
    return metric + OWN_SUFFIX


@dataclass(frozen=True)
class OwnRule:
    """The own-content rule's thresholds (docs/evaluation.md, "Own content")."""

    ngram: int = OWN_NGRAM
    min_words: int = OWN_MIN_WORDS

    def __post_init__(self) -> None:
        if self.ngram < 2:
            raise ValueError("the own-content n-gram length must be at least 2")
        if self.min_words < 1:
            raise ValueError("the own-content minimum must be at least 1 word")

    def definition(self) -> str:
        """The rule in one sentence (metrics.json)."""
        return (
            f"a Client word is copied when it lies in a run of >= {self.ngram} words that an earlier "
            "utterance of the dialogue (the partner's or its own) contains (runs of stopwords only "
            "never count); own content is the utterance without its copied runs; an utterance "
            f"something was cut from that keeps fewer than {self.min_words} words is left out"
        )


@dataclass(frozen=True)
class OwnUtterance:
    """One client-side utterance and what is left of it."""

    index: int  # 0-based position in the dialogue
    speaker: str
    turn: int  # 0-based over this speaker's turns
    raw: str
    n_words: int
    n_copied: int
    text: str | None  # the own content; None: left out

    @property
    def copied_share(self) -> float:
        """The share of its words that were copied (0 for an utterance without words)."""
        return self.n_copied / self.n_words if self.n_words else 0.0

    @property
    def kept(self) -> bool:
        return self.text is not None


@dataclass
class OwnContent:
    """Own content of every dialogue's client-side utterances (client seats in a group)."""

    rule: OwnRule
    utterances: dict[str, list[OwnUtterance]] = field(default_factory=dict)

    def texts(self, dialogue_id: str, n_utterances: int) -> tuple[str | None, ...]:
        """One entry per utterance of the dialogue: the own content of a client-side one
        (``None``: left out), ``None`` for every other utterance."""
        out: list[str | None] = [None] * n_utterances
        for u in self.utterances.get(dialogue_id, []):
            out[u.index] = u.text
        return tuple(out)


def own_content(convs: Iterable[Conversation], rule: OwnRule | None = None) -> OwnContent:
    """Own content of each conversation's client-side utterances (``Conversation.sides``)."""
    rule = rule or OwnRule()
    out = OwnContent(rule)
    for conv in convs:
        masks = copied_words(conv.texts, rule.ngram)
        turns: dict[str, int] = defaultdict(int)
        rows: list[OwnUtterance] = []
        for i, (speaker, side, text) in enumerate(zip(conv.speakers, conv.sides, conv.texts, strict=True)):
            if side != "client":
                continue
            mask = masks[i]
            copied = sum(mask)
            own: str | None = text if not copied else without_copied(text, mask)
            if copied and len(mask) - copied < rule.min_words:
                own = None
            rows.append(OwnUtterance(i, speaker, turns[speaker], text, len(mask), copied, own))
            turns[speaker] += 1
        out.utterances[conv.dialogue_id] = rows
    return out


def own_texts(own: OwnContent, convs: Iterable[Conversation]) -> dict[str, tuple[str | None, ...]]:
    """dialogue_id -> one entry per utterance (see :meth:`OwnContent.texts`)."""
    return {c.dialogue_id: own.texts(c.dialogue_id, len(c.texts)) for c in convs}


def own_conversations(own: OwnContent, convs: Iterable[Conversation]) -> dict[str, Conversation]:
    """The conversations whose client side changed on own content, as the consistency judge
    reads them: each client-side utterance replaced by its own content, those left out dropped
    (every other utterance as it was). A conversation without copying is not among them."""
    out: dict[str, Conversation] = {}
    for conv in convs:
        rows = {u.index: u for u in own.utterances.get(conv.dialogue_id, [])}
        if all(u.text == u.raw for u in rows.values()):
            continue
        keep = [i for i in range(len(conv.texts)) if i not in rows or rows[i].text is not None]
        texts = tuple(rows[i].text or "" if i in rows else conv.texts[i] for i in keep)
        out[conv.dialogue_id] = replace(
            conv,
            speakers=tuple(conv.speakers[i] for i in keep),
            texts=texts,
            roles=None if conv.roles is None else tuple(conv.roles[i] for i in keep),
            seat_personas=None if conv.seat_personas is None else tuple(conv.seat_personas[i] for i in keep),
        )
    return out


def own_vectors(
    own: OwnContent, client_vectors: Mapping[str, FloatArray], embed: Embed
) -> dict[str, FloatArray]:
    """The own-content embedding of every Client utterance of a two-party dialogue, in the order
    of ``client_vectors`` (its raw ones): the raw row when nothing was cut, the embedding of the
    own content when something was, a row of NaN when the utterance is left out."""
    changed = sorted({u.text for rows in own.utterances.values() for u in rows
                      if u.text is not None and u.text != u.raw})
    vecs = embed(changed) if changed else None
    row_of = {t: i for i, t in enumerate(changed)}
    out: dict[str, FloatArray] = {}
    for did, raw in client_vectors.items():
        rows = [u for u in own.utterances.get(did, []) if u.speaker == "client"]
        if len(rows) != len(raw):  # not a two-party client side: nothing to align with
            continue
        matrix = np.array(raw, dtype=np.float32, copy=True)
        for k, u in enumerate(rows):
            if u.text is None:
                matrix[k] = np.nan
            elif u.text != u.raw and vecs is not None:
                matrix[k] = vecs[row_of[u.text]]
        out[did] = matrix
    return out


def per_turn_frame(
    own: OwnContent,
    convs: Sequence[Conversation],
    drift: DriftSeries | None = None,
    drift_own: DriftSeries | None = None,
) -> pd.DataFrame:
    """``per_turn.parquet``: one row per client-side utterance — where it is, how many of its
    words were copied, its own content (null: left out) and, for a two-party Client, its drift
    per dimension at that turn, raw and on own content."""
    info = {c.dialogue_id: c for c in convs}
    records: list[dict[str, object]] = []
    dims = DRIFT_DIMENSIONS
    for did, rows in own.utterances.items():
        conv = info[did]
        for u in rows:
            record: dict[str, object] = {
                "dialogue_id": did,
                "condition": conv.condition,
                "pairing": conv.pairing,
                "turn_index": u.index,
                "speaker": u.speaker,
                "client_turn": u.turn,
                "n_words": u.n_words,
                "n_copied_words": u.n_copied,
                "copied_share": u.copied_share,
                "kept": u.kept,
                "own_text": u.text,
            }
            for dim in dims:
                for name, series in (("", drift), (OWN_SUFFIX, drift_own)):
                    values = (series or {}).get(did, {}).get(dim)
                    value = math.nan
                    if values is not None and not conv.is_group and u.turn < len(values):
                        value = float(values[u.turn])
                    record[drift_column(dim) + name] = value
            records.append(record)
    columns = ["dialogue_id", "condition", "pairing", "turn_index", "speaker", "client_turn", "n_words",
               "n_copied_words", "copied_share", "kept", "own_text"]
    drift_columns = [drift_column(d) + s for d in dims for s in ("", OWN_SUFFIX)]
    frame = pd.DataFrame(records, columns=[*columns, *drift_columns])
    for column in ("turn_index", "client_turn", "n_words", "n_copied_words"):
        frame[column] = frame[column].astype("int64")
    frame["kept"] = frame["kept"].astype(bool)
    frame["copied_share"] = frame["copied_share"].astype(float)
    return frame


def own_metrics(
    own: OwnContent, convs: Sequence[Conversation], notes: Sequence[str] = ()
) -> OwnContentMetrics:
    """metrics.json -> ``own_content``: the rule, and per condition (and ``all``) how much of the
    Client's words were copied and how many utterances were left out."""
    info = {c.dialogue_id: c for c in convs}
    by_condition: dict[str, list[OwnUtterance]] = defaultdict(list)
    share: dict[str, list[float]] = defaultdict(list)
    for did, rows in own.utterances.items():
        cond = info[did].condition
        for key in ("all", cond):
            by_condition[key].extend(rows)
            words = sum(u.n_words for u in rows)
            if words:
                share[key].append(sum(u.n_copied for u in rows) / words)
    stats = []
    for cond in ["all", *ordered_conditions(c for c in by_condition if c != "all")]:
        rows = by_condition[cond]
        mean, low, high, n = mean_ci(share[cond])
        stats.append(
            OwnContentStat(
                condition=cond,
                dialogues=n,
                utterances=len(rows),
                with_copying=sum(u.n_copied > 0 for u in rows),
                left_out=sum(not u.kept for u in rows),
                copied_share=finite(mean),
                copied_share_ci_low=finite(low),
                copied_share_ci_high=finite(high),
            )
        )
    return OwnContentMetrics(
        ngram=own.rule.ngram,
        min_words=own.rule.min_words,
        definition=own.rule.definition(),
        stats=stats,
        notes=list(notes),
    )
