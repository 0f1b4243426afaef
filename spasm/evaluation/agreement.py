"""Agreement on echoing labels: between annotators, and between people and the detectors.

The labels are the run's ``annotations`` table (:class:`spasm.dataset.rows.AnnotationRow`,
written by ``spasm view``): append-only, so the *latest* label per (dialogue, annotator) counts
(``labelled_at``, then ``annotation_id`` to break ties) and earlier ones stay in the table.

* **Between annotators**: Cohen's κ when the run has exactly two annotators (on the dialogues
  both labelled), Fleiss' κ when it has more (on the dialogues labelled by at least two; with a
  varying number of raters per dialogue each dialogue's agreement is averaged over its own
  raters, which is Fleiss' formula when every dialogue has the same number). Reported for the
  four echoing labels (none / client / responder / both), for echoing yes/no, and for role flip.
* **People vs a detector** (the rule, and the LLM judge when it ran): Cohen's κ between the
  majority human yes/no label of each dialogue (ties left out) and the detector's verdict.

The single-file format — one ``annotations.parquet``
file whose ``echoing`` is a boolean (or 0/1), one row per annotator — is still read: true
becomes ``"yes"`` (echoing, side not given), false ``"none"``, and rows without an annotator are
numbered raters per dialogue.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal, Protocol

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict

from spasm.dataset import open_run
from spasm.evaluation.stats import finite

__all__ = [
    "ECHO_LABELS",
    "AgreementReport",
    "DetectorAgreement",
    "RaterAgreement",
    "agreement_report",
    "cohen_kappa",
    "fleiss_kappa",
    "human_agreement",
    "latest_labels",
    "read_labels",
]

#: The echoing labels an annotator chooses from (``"yes"`` only appears in migrated old files).
ECHO_LABELS = ("none", "client", "responder", "both")


class _Verdict(Protocol):
    @property
    def echoing(self) -> bool: ...


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RaterAgreement(_Model):
    """Agreement between annotators on the dialogues at least two of them labelled."""

    statistic: Literal["cohen", "fleiss"]
    n_annotators: int
    n_dialogues: int
    #: κ over the four echoing labels.
    kappa_echoing: float | None
    #: κ over echoing yes/no.
    kappa_echoing_binary: float | None
    kappa_role_flip: float | None


class DetectorAgreement(_Model):
    """Cohen's κ between the majority human label and one detector's verdicts."""

    detector: Literal["rule", "judge"]
    n_dialogues: int
    kappa: float | None
    #: Share of dialogues where people and the detector agree.
    accuracy: float | None


class AgreementReport(_Model):
    """Everything measured on the labels of one run."""

    annotators: list[str]
    n_labels: int
    #: Labels replaced by a later label of the same annotator on the same dialogue.
    n_superseded: int
    n_dialogues: int
    between_annotators: RaterAgreement | None
    vs_detectors: list[DetectorAgreement]

    def note(self) -> str:
        """One sentence for metrics.json and the report."""
        who = ", ".join(self.annotators)
        parts = [f"{len(self.annotators)} annotator(s) ({who}) labelled {self.n_dialogues} "
                 f"dialogue(s) ({self.n_labels} labels, {self.n_superseded} superseded)"]
        b = self.between_annotators
        if b is not None:
            name = "Cohen's" if b.statistic == "cohen" else "Fleiss'"
            parts.append(f"between annotators {name} κ = {_fmt(b.kappa_echoing)} (echoing label), "
                         f"{_fmt(b.kappa_echoing_binary)} (echoing yes/no), "
                         f"{_fmt(b.kappa_role_flip)} (role flip) on {b.n_dialogues} dialogue(s)")
        for d in self.vs_detectors:
            parts.append(f"people (majority) vs {d.detector} Cohen's κ = {_fmt(d.kappa)} on "
                         f"{d.n_dialogues} dialogue(s)")
        return "; ".join(parts)


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


# -- statistics ----------------------------------------------------------------------------


def cohen_kappa(a: Sequence[object], b: Sequence[object]) -> float | None:
    """Cohen's κ of two raters' labels on the same items; ``None`` when undefined (fewer than
    two items, or both raters used one and the same label throughout)."""
    from sklearn.metrics import cohen_kappa_score

    if len(a) != len(b):
        raise ValueError("the two label lists differ in length")
    if len(a) < 2 or len(set(a) | set(b)) < 2:
        return None
    return finite(float(cohen_kappa_score([str(x) for x in a], [str(x) for x in b])))


def fleiss_kappa(counts: np.ndarray) -> float | None:
    """Fleiss' κ of an items × categories matrix of rating counts (each item rated at least
    twice). With a varying number of raters per item each item's agreement is taken over its
    own raters. ``None`` when undefined (no items, or a single category used)."""
    counts = np.asarray(counts, dtype=float)
    if counts.ndim != 2 or counts.shape[0] == 0:
        return None
    n = counts.sum(axis=1)
    if (n < 2).any():
        raise ValueError("every item needs at least two ratings")
    p_item = ((counts * counts).sum(axis=1) - n) / (n * (n - 1))
    p_cat = counts.sum(axis=0) / n.sum()
    p_bar, p_e = float(p_item.mean()), float((p_cat * p_cat).sum())
    if p_e >= 1.0:
        return None
    return finite((p_bar - p_e) / (1.0 - p_e))


# -- labels --------------------------------------------------------------------------------


def _migrate(frame: pd.DataFrame) -> pd.DataFrame:
    """Bring a labels frame in the old boolean format to the current one (see the module)."""
    frame = frame.copy()
    echo = frame["echoing"] if "echoing" in frame else pd.Series([None] * len(frame), dtype=object)
    if pd.api.types.is_bool_dtype(echo) or pd.api.types.is_numeric_dtype(echo):
        frame["echoing"] = [None if pd.isna(v) else ("yes" if bool(v) else "none") for v in echo]
    if "annotator" not in frame or frame["annotator"].isna().any():
        rater = frame.groupby("dialogue_id").cumcount().map(lambda k: f"rater{k + 1}")
        given = frame["annotator"] if "annotator" in frame else pd.Series([None] * len(frame))
        frame["annotator"] = [g if isinstance(g, str) and g else r for g, r in zip(given, rater,
                                                                                     strict=True)]
    for column in ("labelled_at", "annotation_id", "role_flip", "note"):
        if column not in frame:
            frame[column] = None
    return frame


def latest_labels(labels: pd.DataFrame) -> pd.DataFrame:
    """The latest label of each annotator on each dialogue (the ones that count)."""
    if labels.empty:
        return labels
    order = labels.assign(_t=pd.to_datetime(labels["labelled_at"], utc=True),
                          _i=labels["annotation_id"].astype(str))
    order = order.sort_values(["_t", "_i"], na_position="first", kind="stable")
    latest = order.drop_duplicates(["dialogue_id", "annotator"], keep="last")
    return latest.drop(columns=["_t", "_i"]).reset_index(drop=True)


def read_labels(run_dir: str | Path) -> pd.DataFrame | None:
    """Every label of the run (superseded ones included), or ``None`` when it has none."""
    run = open_run(run_dir)
    if not run.has("annotations"):
        return None
    frame = run.df("annotations")
    if frame.empty or "dialogue_id" not in frame:
        return None
    frame = frame.assign(dialogue_id=frame["dialogue_id"].astype(str))
    return _migrate(frame)


def _echoes(label: object) -> bool | None:
    return None if not isinstance(label, str) else label != "none"


def _counts(rows: Sequence[Sequence[object]], categories: Sequence[object]) -> np.ndarray:
    """The items × categories count matrix of the rows rated at least twice."""
    index = {c: i for i, c in enumerate(categories)}
    out = []
    for row in rows:
        cell = [0] * len(categories)
        for value in row:
            if value in index:
                cell[index[value]] += 1
        if sum(cell) >= 2:
            out.append(cell)
    return np.array(out, dtype=float).reshape(-1, len(categories))


def _between(latest: pd.DataFrame, annotators: list[str]) -> RaterAgreement | None:
    if len(annotators) < 2:
        return None
    echo = latest.pivot(index="dialogue_id", columns="annotator", values="echoing")
    flip = latest.pivot(index="dialogue_id", columns="annotator", values="role_flip")
    echo, flip = echo.reindex(columns=annotators), flip.reindex(columns=annotators)
    if len(annotators) == 2:
        both, flips = echo.dropna(), flip.dropna()
        a, b = both[annotators[0]].tolist(), both[annotators[1]].tolist()
        return RaterAgreement(
            statistic="cohen", n_annotators=2, n_dialogues=len(both),
            kappa_echoing=cohen_kappa(a, b),
            kappa_echoing_binary=cohen_kappa([_echoes(x) for x in a], [_echoes(x) for x in b]),
            kappa_role_flip=cohen_kappa([bool(x) for x in flips[annotators[0]]],
                                        [bool(x) for x in flips[annotators[1]]]),
        )
    labels = [[v for v in row if isinstance(v, str)] for row in echo.to_numpy().tolist()]
    flips_rows = [[bool(v) for v in row if not pd.isna(v)] for row in flip.to_numpy().tolist()]
    categories = sorted({v for row in labels for v in row})
    echo_counts = _counts(labels, categories)
    return RaterAgreement(
        statistic="fleiss", n_annotators=len(annotators), n_dialogues=len(echo_counts),
        kappa_echoing=fleiss_kappa(echo_counts),
        kappa_echoing_binary=fleiss_kappa(_counts([[_echoes(v) for v in r] for r in labels],
                                                  [False, True])),
        kappa_role_flip=fleiss_kappa(_counts(flips_rows, [False, True])),
    )


def _majority(latest: pd.DataFrame) -> dict[str, bool]:
    """Each dialogue's majority yes/no echoing label; ties are left out."""
    out: dict[str, bool] = {}
    for did, group in latest.dropna(subset=["echoing"]).groupby("dialogue_id"):
        votes = [bool(_echoes(v)) for v in group["echoing"]]
        yes = sum(votes)
        if 2 * yes != len(votes):
            out[str(did)] = 2 * yes > len(votes)
    return out


def agreement_report(labels: pd.DataFrame, detectors: Mapping[str, Mapping[str, bool]]) -> AgreementReport:
    """Agreement between the annotators of ``labels`` and with each detector's verdicts
    (``{"rule": {dialogue_id: echoing}, "judge": {...}}``). Labels in the single-file format (a
    boolean ``echoing``, no annotator or time) are read as :func:`read_labels` reads them."""
    latest = latest_labels(_migrate(labels))
    annotators = sorted({str(a) for a in latest["annotator"]})
    majority = _majority(latest)
    versus = []
    for name, verdicts in detectors.items():
        ids = [d for d in majority if d in verdicts]
        people, machine = [majority[d] for d in ids], [bool(verdicts[d]) for d in ids]
        versus.append(DetectorAgreement(
            detector="judge" if name == "judge" else "rule", n_dialogues=len(ids),
            kappa=cohen_kappa(people, machine),
            accuracy=(sum(p == m for p, m in zip(people, machine, strict=True)) / len(ids)) if ids else None,
        ))
    return AgreementReport(
        annotators=annotators, n_labels=len(labels), n_superseded=len(labels) - len(latest),
        n_dialogues=int(latest["dialogue_id"].nunique()),
        between_annotators=_between(latest, annotators), vs_detectors=versus,
    )


def human_agreement(
    run_dir: str | Path,
    rule: Mapping[str, _Verdict],
    judge: Mapping[str, _Verdict] | None = None,
) -> tuple[float | None, str | None]:
    """``(κ, note)`` for ``spasm eval``: κ between people and the verdicts the evaluation
    reports (the judge's when it ran, else the rule's), and a note with every figure of
    :class:`AgreementReport`. ``(None, None)`` when the run has no labels."""
    labels = read_labels(run_dir)
    if labels is None:
        return None, None
    detectors = {"rule": {d: v.echoing for d, v in rule.items()}}
    if judge is not None:
        detectors["judge"] = {d: v.echoing for d, v in judge.items()}
    report = agreement_report(labels, detectors)
    final = report.vs_detectors[-1]
    return final.kappa, report.note()
