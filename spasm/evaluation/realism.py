"""Realism of a run's dialogues: lexical diversity per side and the Client diagnostics,
as values and as z-scores against a reference corpus.

Per dialogue (columns of ``per_dialogue.parquet``): ``mattr_<side>``, ``yules_k_<side>``,
``hdd_<side>`` for side ∈ {client, responder} (:mod:`~spasm.evaluation.lexical`),
``front_loading_client``, ``politeness_client``, ``verbosity_cv_client``,
``frustration_client`` (:mod:`~spasm.evaluation.diagnostics`), and ``n_words_<side>``.

In a group dialogue the client side is every client seat's utterances and the responder side
every responder seat's (the utterance's ``turns.role``): the lexical measures run over each
side's words in dialogue order, and :func:`~spasm.evaluation.diagnostics.seat_diagnostics`
gives the Client diagnostics (front-loading and verbosity CV per seat, averaged).

With a reference (any run directory or imported dataset, read through
:func:`spasm.evaluation.loader.load_run`), each metric also gets
``<metric>_z = (value − mean_ref) / sd_ref``, where mean and sample sd are over the
reference's dialogues — MirrorBench's per-episode z against the human baseline. A metric
whose reference sd is 0 or that the reference defines for fewer than two dialogues gets no
z-score (a note says so).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from spasm.evaluation.diagnostics import client_diagnostics, seat_diagnostics
from spasm.evaluation.lexical import HDD_SAMPLE, MATTR_WINDOW, hdd_many, mattr, word_tokens, yules_k
from spasm.evaluation.loader import Conversation
from spasm.evaluation.metrics import RealismMetrics, RealismReference, RealismStat, ReferenceStat
from spasm.evaluation.stats import finite, mean_ci
from spasm.evaluation.summary import group_key

__all__ = [
    "DEFINITIONS",
    "REALISM_METRICS",
    "realism_frame",
    "realism_metrics",
    "reference_from",
    "reference_stats",
    "z_scores",
]

SIDES = ("client", "responder")
_LEXICAL = ("mattr", "yules_k", "hdd")
_DIAGNOSTICS = ("front_loading", "politeness", "verbosity_cv", "frustration")

#: Every realism column, in reporting order.
REALISM_METRICS: tuple[str, ...] = (
    *(f"{m}_{side}" for side in SIDES for m in _LEXICAL),
    *(f"{d}_client" for d in _DIAGNOSTICS),
)

DEFINITIONS: dict[str, str] = {
    "mattr": f"moving-average type-token ratio, window {MATTR_WINDOW} (Covington & McFall 2010); "
    "higher = more diverse",
    "yules_k": "Yule's K = 1e4 (sum f^2 - N) / N^2 (Yule 1944); higher = more repetitive",
    "hdd": f"HD-D: expected TTR of a {HDD_SAMPLE}-token sample (McCarthy & Jarvis 2010); "
    "higher = more diverse",
    "front_loading": "share of the Client's content words already in its first turn (NeMo User Sim D1)",
    "politeness": "share of Client turns with a politeness marker (NeMo User Sim D2)",
    "verbosity_cv": "coefficient of variation of Client turn lengths in words (NeMo User Sim D3)",
    "frustration": "share of Client turns with a frustration marker (NeMo User Sim D4)",
}


def _base(metric: str) -> str:
    return metric.rsplit("_", 1)[0]


def realism_frame(conversations: Sequence[Conversation]) -> pd.DataFrame:
    """One row per conversation (index ``dialogue_id``): every realism column and word counts."""
    rows: list[dict[str, float | None]] = []
    counts: list[list[int]] = []
    for conv in conversations:
        row: dict[str, float | None] = {}
        tokens_by_side: dict[str, list[list[str]]] = {side: [] for side in SIDES}
        texts_by_side: dict[str, list[str]] = {side: [] for side in SIDES}
        seats: dict[str, tuple[list[str], list[list[str]]]] = {}  # group dialogues: client seats
        group = conv.is_group
        for speaker, side, text in zip(conv.speakers, conv.sides, conv.texts, strict=True):
            if side in tokens_by_side:
                tokens_by_side[side].append(word_tokens(text))
                texts_by_side[side].append(text)
                if group and side == "client":
                    seat = seats.setdefault(speaker, ([], []))
                    seat[0].append(text)
                    seat[1].append(tokens_by_side[side][-1])
        for side in SIDES:
            flat = [t for turn in tokens_by_side[side] for t in turn]
            freq = Counter(flat)
            row[f"mattr_{side}"] = mattr(flat)
            row[f"yules_k_{side}"] = yules_k(freq.values())
            row[f"n_words_{side}"] = float(len(flat))
            counts.append(list(freq.values()))
        diagnostics = (
            seat_diagnostics(list(seats.values()))
            if group
            else client_diagnostics(texts_by_side["client"], tokens_by_side["client"])
        )
        for name, value in diagnostics.items():
            row[f"{name}_client"] = value
        rows.append(row)
    hdds = hdd_many(counts)
    for k, row in enumerate(rows):
        for j, side in enumerate(SIDES):
            row[f"hdd_{side}"] = hdds[k * len(SIDES) + j]
    columns = [*REALISM_METRICS, *(f"n_words_{side}" for side in SIDES)]
    frame = pd.DataFrame(rows, columns=columns, index=[c.dialogue_id for c in conversations], dtype=float)
    frame.index.name = "dialogue_id"
    return frame


def reference_stats(frame: pd.DataFrame) -> list[ReferenceStat]:
    """Mean and sample sd of every realism column over the reference's dialogues."""
    out = []
    for metric in REALISM_METRICS:
        values = frame[metric].to_numpy(dtype=float) if metric in frame else np.array([])
        values = values[np.isfinite(values)]
        n = int(values.size)
        out.append(
            ReferenceStat(
                metric=metric,
                n=n,
                mean=float(values.mean()) if n else None,
                sd=float(values.std(ddof=1)) if n >= 2 else None,
            )
        )
    return out


def z_scores(frame: pd.DataFrame, reference: Iterable[ReferenceStat]) -> pd.DataFrame:
    """``<metric>_z`` columns for the metrics the reference can standardise (sd > 0)."""
    out = pd.DataFrame(index=frame.index)
    for ref in reference:
        if ref.metric not in frame or ref.mean is None or not ref.sd:
            continue
        out[f"{ref.metric}_z"] = (frame[ref.metric] - ref.mean) / ref.sd
    return out


def realism_metrics(
    frame: pd.DataFrame,
    conversations: Sequence[Conversation],
    reference: RealismReference | None = None,
) -> RealismMetrics:
    """Aggregate the per-dialogue realism frame (with ``_z`` columns when there is a reference)."""
    groups: dict[tuple[str, str], list[str]] = {}
    for conv in conversations:
        groups.setdefault((conv.pairing, conv.condition), []).append(conv.dialogue_id)
    scopes = [(("all", "all"), [c.dialogue_id for c in conversations])]
    scopes += sorted(groups.items(), key=group_key)
    stats: list[RealismStat] = []
    for (pairing, condition), ids in scopes:
        sub = frame.loc[frame.index.intersection(ids)]
        for metric in REALISM_METRICS:
            values = sub[metric].to_numpy(dtype=float)
            mean, low, high, n = mean_ci(values.tolist())
            finite_values = values[np.isfinite(values)]
            z_col = f"{metric}_z"
            mean_z = z_low = z_high = None
            if z_col in sub:
                mz, zl, zh, nz = mean_ci(sub[z_col].to_numpy(dtype=float).tolist())
                if nz:
                    mean_z, z_low, z_high = finite(mz), finite(zl), finite(zh)
            stats.append(
                RealismStat(
                    metric=metric,
                    pairing=pairing,
                    condition=condition,
                    n=n,
                    mean=finite(mean),
                    sd=float(finite_values.std(ddof=1)) if n >= 2 else None,
                    ci_low=finite(low),
                    ci_high=finite(high),
                    mean_z=mean_z,
                    z_ci_low=z_low,
                    z_ci_high=z_high,
                )
            )
    notes: list[str] = []
    if reference is not None:
        unusable = [s.metric for s in reference.stats if s.mean is None or not s.sd]
        if unusable:
            notes.append(
                "No z-score for " + ", ".join(unusable) + ": the reference defines it for fewer "
                "than two dialogues or it does not vary there."
            )
    else:
        notes.append("No reference corpus (--reference RUN): values only, no z-scores.")
    n_group = sum(c.is_group for c in conversations)
    if n_group:
        notes.append(
            f"{n_group} group dialogue(s): the client side is every client seat's utterances and the "
            "responder side every responder seat's (turns.role); front-loading and verbosity CV are "
            "computed per client seat and averaged. A pooled side mixes several speakers, so its "
            "lexical diversity is not comparable with a two-party Client's."
        )
    if "n_words_client" in frame:
        words = frame["n_words_client"]
        no_hdd, ttr = int((words < HDD_SAMPLE).sum()), int((words < MATTR_WINDOW).sum())
        if ttr:
            notes.append(
                f"{ttr} dialogue(s) have a Client side under {MATTR_WINDOW} words (MATTR is then "
                f"its plain type-token ratio); {no_hdd} under {HDD_SAMPLE} (no HD-D)."
            )
    return RealismMetrics(
        mattr_window=MATTR_WINDOW,
        hdd_sample=HDD_SAMPLE,
        metrics=list(REALISM_METRICS),
        definitions={m: DEFINITIONS[_base(m)] for m in REALISM_METRICS},
        reference=reference,
        stats=stats,
        notes=notes,
    )


def reference_from(run_dir: str | Path) -> RealismReference:
    """The reference statistics of another run or imported dataset (or of the runs in a
    folder, pooled: :func:`~spasm.evaluation.loader.load_reference`)."""
    from spasm.evaluation.loader import load_reference

    runs = load_reference(run_dir)
    if len(runs) == 1:
        data = runs[0]
        frame = realism_frame(data.conversations)
        return RealismReference(run_dir=str(data.run_dir), dialogues=len(frame),
                                stats=reference_stats(frame))
    frame = pd.concat([realism_frame(d.conversations) for d in runs])
    return RealismReference(run_dir=str(run_dir), dialogues=len(frame), stats=reference_stats(frame))

