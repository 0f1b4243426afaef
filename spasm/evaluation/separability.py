"""Persona separability: can the Client's side of a conversation tell you who the persona is?

Inputs are one embedding per conversation (the mean of the Client's utterance embeddings,
re-normalised; see docs/evaluation.md) and the persona id as the label.

* silhouette (cosine metric) and Davies–Bouldin index (on the unit vectors), from
  scikit-learn; both need at least 2 personas and at least one persona with 2+
  conversations, otherwise ``None`` with a note;
* intra-persona cosine distance: every pair of conversations of the same persona,
  pooled, mean ± sd;
* persona retrieval Acc@K, K = 1..10: rank the candidate personas by cosine similarity of
  the conversation to each persona's *card* embedding (default), or, with
  ``retrieval="centroid"``, to the centroid of that persona's *other* conversations
  (leave-one-out); Acc@K is the share of conversations whose persona ranks in the top K
  (rank = 1 + the number of personas scoring strictly higher). Random baseline: min(1, K/N).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

from spasm.evaluation.embeddings import FloatArray, l2_normalise

__all__ = ["SeparabilityScores", "retrieval_accuracy", "separability_scores"]

Retrieval = Literal["card", "centroid"]


@dataclass
class SeparabilityScores:
    """The separability numbers of one group of conversations."""

    n_conversations: int
    n_personas: int
    silhouette: float | None
    davies_bouldin: float | None
    intra_mean: float | None
    intra_sd: float | None
    retrieval: Retrieval
    n_queries: int
    acc_at_k: list[float | None]
    random_at_k: list[float | None]
    notes: list[str] = field(default_factory=list)
    #: Per conversation, in input order: the rank of its own persona (``None``: not queried)
    #: and its silhouette value (``None`` when the silhouette is undefined). Their means are
    #: Acc@1 (the share of rank 1) and the silhouette, so a per-dialogue column can be paired
    #: across conditions.
    ranks: list[int | None] = field(default_factory=list)
    silhouette_samples: list[float | None] = field(default_factory=list)


def retrieval_accuracy(
    vectors: FloatArray,
    labels: Sequence[str],
    *,
    retrieval: Retrieval = "card",
    cards: Mapping[str, FloatArray] | None = None,
    k_max: int = 10,
) -> tuple[list[float | None], list[float | None], int, str | None]:
    """Acc@K (K = 1..k_max) of retrieving each conversation's persona.

    Returns:
        ``(acc_at_k, random_at_k, n_queries, note)``; accuracies are ``None`` when no
        conversation can be queried (the note says why).
    """
    acc, rand, n_queries, note, _ = _retrieval(vectors, labels, retrieval=retrieval, cards=cards, k_max=k_max)
    return acc, rand, n_queries, note


def _retrieval(
    vectors: FloatArray,
    labels: Sequence[str],
    *,
    retrieval: Retrieval,
    cards: Mapping[str, FloatArray] | None,
    k_max: int,
) -> tuple[list[float | None], list[float | None], int, str | None, list[int | None]]:
    """:func:`retrieval_accuracy`, and each conversation's rank (``None``: not queried)."""
    labels = [str(x) for x in labels]
    personas = sorted(set(labels))
    position = {p: i for i, p in enumerate(personas)}
    label_idx = np.array([position[x] for x in labels], dtype=int)
    none: list[float | None] = [None] * k_max
    if retrieval == "card":
        if cards is None or any(p not in cards for p in personas):
            missing = [p for p in personas if cards is None or p not in cards]
            return none, none, 0, f"no card embedding for {len(missing)} persona(s)", [None] * len(labels)
        cand = l2_normalise(np.stack([cards[p] for p in personas]))
        sims = vectors @ cand.T  # (n_conv, n_personas)
        query = np.ones(len(labels), dtype=bool)
        n_candidates = np.full(len(labels), len(personas))
    else:
        sums = np.zeros((len(personas), vectors.shape[1]), dtype=np.float64)
        counts = np.zeros(len(personas))
        np.add.at(sums, label_idx, vectors)
        np.add.at(counts, label_idx, 1)
        sims = np.full((len(labels), len(personas)), -np.inf)
        # Leave-one-out: a conversation never votes for its own persona's centroid.
        own_counts = counts[label_idx]
        query = own_counts >= 2
        for i in range(len(labels)):
            s = sums.copy()
            c = counts.copy()
            s[label_idx[i]] -= vectors[i]
            c[label_idx[i]] -= 1
            valid = c > 0
            cent = l2_normalise(s[valid] / c[valid, None])
            sims[i, valid] = cent @ vectors[i]
        n_candidates = np.where(own_counts >= 2, (counts > 0).sum(), (counts > 0).sum() - 1)
    n_queries = int(query.sum())
    if n_queries == 0:
        return (
            none,
            none,
            0,
            "no persona has 2+ conversations, so nothing can be retrieved by centroid",
            [None] * len(labels),
        )
    true = sims[np.arange(len(labels)), label_idx]
    all_ranks = 1 + (sims > true[:, None]).sum(axis=1)
    each: list[int | None] = [int(r) if q else None for r, q in zip(all_ranks, query, strict=True)]
    ranks, n_candidates = all_ranks[query], n_candidates[query]
    acc: list[float | None] = [round(float(np.mean(ranks <= k)), 6) for k in range(1, k_max + 1)]
    rand: list[float | None] = [
        round(float(np.mean(np.minimum(1.0, k / n_candidates))), 6) for k in range(1, k_max + 1)
    ]
    return acc, rand, n_queries, None, each


def _intra_distances(vectors: FloatArray, labels: npt.NDArray[np.int_]) -> list[float]:
    dists: list[float] = []
    for label in np.unique(labels):
        rows = vectors[labels == label]
        if len(rows) < 2:
            continue
        sim = rows @ rows.T
        iu = np.triu_indices(len(rows), k=1)
        dists.extend((1.0 - sim[iu]).tolist())
    return dists


def separability_scores(
    vectors: npt.ArrayLike,
    labels: Sequence[str],
    *,
    retrieval: Retrieval = "card",
    cards: Mapping[str, FloatArray] | None = None,
    k_max: int = 10,
) -> SeparabilityScores:
    """Silhouette, Davies–Bouldin, intra-persona distance and Acc@K for one group.

    Args:
        vectors: one embedding per conversation (normalised here).
        labels: the persona id of each conversation.
        retrieval: ``"card"`` (rank personas by their card embedding) or ``"centroid"``.
        cards: persona id -> card embedding (needed for ``"card"``).
    """
    from sklearn import config_context
    from sklearn.metrics import davies_bouldin_score, silhouette_samples

    x = l2_normalise(vectors) if len(labels) else np.zeros((0, 1), dtype=np.float32)
    labels = [str(v) for v in labels]
    personas = sorted(set(labels))
    position = {p: i for i, p in enumerate(personas)}
    idx = np.array([position[v] for v in labels], dtype=int)
    notes: list[str] = []
    silhouette = dbi = None
    samples: list[float | None] = [None] * len(labels)
    n, k = len(labels), len(personas)
    if k < 2:
        notes.append("silhouette/DBI need at least 2 personas")
    elif n <= k:
        notes.append("silhouette/DBI need a persona with 2+ conversations")
    else:
        # Pairwise distances in 64 MiB blocks of rows, not scikit-learn's default 1 GiB: with
        # ~11,000 conversations a group (the SPASM corpus size) that is ~1.2 GiB less peak
        # memory and ~3x faster; the score agrees to float rounding.
        with config_context(working_memory=64):
            # silhouette_score is the mean of these samples (scikit-learn computes it so).
            per_sample = silhouette_samples(x, idx, metric="cosine")
        silhouette = float(np.mean(per_sample))
        samples = [float(v) for v in per_sample]
        dbi = float(davies_bouldin_score(x, idx))
    intra = _intra_distances(x, idx)
    intra_mean = float(np.mean(intra)) if intra else None
    intra_sd = float(np.std(intra, ddof=1)) if len(intra) >= 2 else (0.0 if intra else None)
    if not intra:
        notes.append("intra-persona distance needs a persona with 2+ conversations")
    acc, rand, n_queries, note, ranks = _retrieval(x, labels, retrieval=retrieval, cards=cards, k_max=k_max)
    if note:
        notes.append(note)
    for value in (silhouette, dbi):
        if value is not None and not math.isfinite(value):
            notes.append("a score was not finite")
    return SeparabilityScores(
        n_conversations=n,
        n_personas=k,
        silhouette=silhouette,
        davies_bouldin=dbi,
        intra_mean=intra_mean,
        intra_sd=intra_sd,
        retrieval=retrieval,
        n_queries=n_queries,
        acc_at_k=acc,
        random_at_k=rand,
        notes=notes,
        ranks=ranks,
        silhouette_samples=samples,
    )
