"""Agreement on human echoing labels (spasm/evaluation/agreement.py): the statistics, the
latest-label rule and the older boolean format."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from spasm.dataset import AnnotationRow, RunStore
from spasm.evaluation.agreement import (
    agreement_report,
    cohen_kappa,
    fleiss_kappa,
    human_agreement,
    latest_labels,
    read_labels,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _labels(rows: list[tuple[str, str, str | None, int]]) -> pd.DataFrame:
    return pd.DataFrame([
        {"annotation_id": f"a{i}", "dialogue_id": d, "annotator": who, "echoing": echo,
         "role_flip": echo in ("client", "both"), "note": None, "labelled_at": T0 + timedelta(minutes=m)}
        for i, (d, who, echo, m) in enumerate(rows)
    ])


def test_fleiss_kappa_matches_the_textbook_example() -> None:
    # Fleiss (1971) as reproduced in most references: 10 subjects, 14 raters, 5 categories.
    table = np.array([[0, 0, 0, 0, 14], [0, 2, 6, 4, 2], [0, 0, 3, 5, 6], [0, 3, 9, 2, 0],
                      [2, 2, 8, 1, 1], [7, 7, 0, 0, 0], [3, 2, 6, 3, 0], [2, 5, 3, 2, 2],
                      [6, 5, 2, 1, 0], [0, 2, 2, 3, 7]])
    assert fleiss_kappa(table) == pytest.approx(0.2099, abs=1e-4)
    assert fleiss_kappa(np.array([[3, 0], [3, 0]])) is None  # one category only: undefined
    with pytest.raises(ValueError):
        fleiss_kappa(np.array([[1, 0]]))


def test_cohen_kappa_is_sklearns_and_undefined_cases_are_none() -> None:
    from sklearn.metrics import cohen_kappa_score  # the reference implementation
    a = ["none", "client", "client", "both", "none", "responder"]
    b = ["none", "client", "none", "both", "none", "client"]
    assert cohen_kappa(a, b) == pytest.approx(cohen_kappa_score(a, b))
    assert cohen_kappa(["none"], ["none"]) is None
    assert cohen_kappa(["none", "none"], ["none", "none"]) is None


def test_the_latest_label_per_annotator_wins_and_earlier_ones_are_counted() -> None:
    labels = _labels([("d1", "ana", "client", 0), ("d1", "ana", "none", 5), ("d1", "ben", "none", 1)])
    latest = latest_labels(labels)
    assert sorted(zip(latest.annotator, latest.echoing, strict=True)) == [("ana", "none"), ("ben", "none")]
    report = agreement_report(labels, {})
    assert (report.n_labels, report.n_superseded, report.n_dialogues) == (3, 1, 1)


def test_two_annotators_get_cohen_and_more_get_fleiss() -> None:
    from sklearn.metrics import cohen_kappa_score  # the reference implementation
    two = _labels([("d1", "ana", "client", 0), ("d1", "ben", "client", 0),
                   ("d2", "ana", "none", 0), ("d2", "ben", "none", 0),
                   ("d3", "ana", "both", 0), ("d3", "ben", "none", 0), ("d4", "ana", "none", 0)])
    b = agreement_report(two, {}).between_annotators
    assert b is not None and b.statistic == "cohen" and b.n_dialogues == 3
    assert b.kappa_echoing == pytest.approx(cohen_kappa_score(["client", "none", "both"],
                                                              ["client", "none", "none"]))
    three = pd.concat([two, _labels([("d1", "cy", "client", 0), ("d2", "cy", "client", 0),
                                     ("d3", "cy", "none", 0)])], ignore_index=True)
    three["annotation_id"] = [f"x{i}" for i in range(len(three))]
    f = agreement_report(three, {}).between_annotators
    assert f is not None and f.statistic == "fleiss" and f.n_annotators == 3
    # d4 has one rating: left out; the rest as an items x categories table (both, client, none).
    expected = fleiss_kappa(np.array([[0, 3, 0], [0, 1, 2], [1, 0, 2]]))
    assert f.n_dialogues == 3 and f.kappa_echoing == pytest.approx(expected)


def test_people_vs_detectors_use_the_majority_and_drop_ties() -> None:
    from sklearn.metrics import cohen_kappa_score  # the reference implementation
    labels = _labels([("d1", "ana", "client", 0), ("d1", "ben", "both", 0), ("d2", "ana", "none", 0),
                      ("d2", "ben", "none", 0), ("d3", "ana", "client", 0), ("d3", "ben", "none", 0),
                      ("d4", "ana", "none", 0)])
    report = agreement_report(labels, {"rule": {"d1": True, "d2": False, "d3": True, "d4": True},
                                       "judge": {"d1": True, "d2": False, "d4": False}})
    rule, judge = report.vs_detectors
    assert (rule.detector, rule.n_dialogues) == ("rule", 3)  # d3 is a tie
    assert rule.kappa == pytest.approx(cohen_kappa_score([True, False, False], [True, False, True]))
    assert (judge.n_dialogues, judge.kappa, judge.accuracy) == (3, 1.0, 1.0)


def test_labels_written_by_the_store_and_the_old_boolean_file_are_read(tmp_path: Path) -> None:
    run = tmp_path / "run"
    store = RunStore(run)
    for i, (d, who, echo) in enumerate([("d1", "ana", "client"), ("d1", "ben", "client"),
                                         ("d2", "ana", "none"), ("d2", "ben", "none")]):
        store.write_batch(f"annotation-{i}", {"annotations": [AnnotationRow(
            annotation_id=f"a{i}", dialogue_id=d, annotator=who, echoing=echo,
            labelled_at=T0 + timedelta(seconds=i))]})

    class V:
        def __init__(self, echoing: bool) -> None:
            self.echoing = echoing

    kappa, note = human_agreement(run, {"d1": V(True), "d2": V(False)})
    assert kappa == 1.0 and note is not None
    assert "between annotators Cohen's κ = 1.00 (echoing label)" in note
    assert "people (majority) vs rule Cohen's κ = 1.00 on 2 dialogue(s)" in note

    old = tmp_path / "old"
    old.mkdir()
    pd.DataFrame({"dialogue_id": ["d1", "d1", "d2", "d2"],
                  "echoing": [True, True, False, True]}).to_parquet(old / "annotations.parquet")
    labels = read_labels(old)
    assert labels is not None
    assert list(labels.echoing) == ["yes", "yes", "none", "yes"]
    assert list(labels.annotator) == ["rater1", "rater2", "rater1", "rater2"]
    _, old_note = human_agreement(old, {"d1": V(True), "d2": V(False)})
    assert old_note is not None and "2 annotator(s) (rater1, rater2)" in old_note
    assert "vs rule Cohen's κ = n/a on 1 dialogue(s)" in old_note  # d2 is a tie: left out
    (tmp_path / "bare").mkdir()
    assert human_agreement(tmp_path / "bare", {}) == (None, None)
