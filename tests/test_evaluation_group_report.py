"""Group dialogues in ``spasm eval``'s report and in the per-side metrics: a group
run on the test server gets the group section and its figures; a hand-made group run's
per-role realism, diagnostics and language values are the ones computed by hand; a two-party
dialogue beside group ones keeps the values it has alone; a two-party run gets the two-party
figures only, no group section, file or metric, and every dialogue measured."""

from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path
from typing import Any

import anyio
import pandas as pd
import pytest

from spasm.config import parse_config
from spasm.dataset.store import write_finished_run
from spasm.engine import Engine
from spasm.evaluation import evaluate, register_embedder
from spasm.evaluation.figures import read_figures
from spasm.evaluation.group_detectors import ECHO_THRESHOLD, pair_echoing
from spasm.evaluation.lexical import MATTR_WINDOW, word_tokens
from spasm.evaluation.pipeline import load_metrics
from spasm.evaluation.report import render_report
from spasm.evaluation.testing import LookupEmbedder
from spasm.personas.schema import load_schema
from spasm.testing import TestServer
from tests.conftest import endpoint_config
from tests.test_group import _group_data

pytestmark = pytest.mark.e2e

register_embedder("lookup", LookupEmbedder)

SEATS = ["Ana", "Ben", "Carla", "Facilitator"]
TWO_PARTY_FIGURES = ["drift", "map", "acc", "echo", "onset", "forest"]
GROUP_FIGURES = ["group_rates", "group_echo_pairs", "group_drift"]


def _group_config(base_url: str) -> dict[str, Any]:
    return _group_data(base_url, next_speaker="round_robin")


@pytest.fixture(scope="module")
def group_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("group") / "run"
    with TestServer() as srv:
        config = parse_config(_group_config(srv.base_url), "<test>")
        summary = anyio.run(Engine(config, run, progress=False, sleep_scale=0).run)
    assert summary.completed == summary.planned == 4, summary.line()
    evaluate(run, embedder="lookup", progress=False)
    return run


def _mattr(tokens: list[str], window: int = MATTR_WINDOW) -> float:
    """MATTR by its definition: the mean type-token ratio of every window (TTR if shorter)."""
    if len(tokens) < window:
        return len(set(tokens)) / len(tokens)
    ratios = [len(set(tokens[i : i + window])) / window for i in range(len(tokens) - window + 1)]
    return sum(ratios) / len(ratios)


def _cells(report: str, heading: str) -> list[list[str]]:
    """The body cells of the first table after ``heading`` in the report."""
    start = report.index(heading)
    table = report[report.index("<tbody>", start) : report.index("</tbody>", start)]
    return [[html.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row)]
            for row in re.findall(r"<tr>(.*?)</tr>", table)]


# --------------------------------------------------------------------------- the report


def test_a_group_runs_report_has_the_group_section_and_figures(group_run: Path) -> None:
    eval_dir = group_run / "eval"
    figures = read_figures(eval_dir)
    assert [f.name for f in figures] == GROUP_FIGURES + TWO_PARTY_FIGURES
    assert all(f.png.startswith(b"\x89PNG") for f in figures)
    report = (eval_dir / "report.html").read_text(encoding="utf-8")
    assert report.count("<h2>Group dialogues: role confusion</h2>") == 1
    for f in figures:  # the HTML embeds the same figures as figures.json
        assert f.data_uri() in report
    # The two-party sections say where the group dialogues went, and so do their figures.
    assert report.count("Two-party dialogues only: the group dialogues are measured in") == 3
    assert "so the 4 group dialogue(s) are left out of them (they are empty for this run)" in report

    # Per participant: every seat, under both conditions.
    people = _cells(report, "<h3>Per participant</h3>")
    assert sorted({(r[0], r[1], r[2]) for r in people}) == sorted(
        (pid, "responder" if pid == "Facilitator" else "client", cond)
        for pid in SEATS for cond in ("ecp", "concat"))

    # Who echoes whom: the table behind the heatmap is the pair score of group_detectors.pair_echoing on
    # the stored turns, averaged over each condition's dialogues.
    turns = pd.read_parquet(group_run / "turns.parquet").sort_values(["dialogue_id", "turn_index"])
    dialogues = pd.read_parquet(group_run / "dialogues.parquet")
    condition = dict(zip(dialogues.dialogue_id, dialogues.condition, strict=True))
    scores: dict[tuple[str, str, str], list[float]] = {}
    for did, t in turns.groupby("dialogue_id"):
        pairs = pair_echoing(list(t.speaker), list(t.text), SEATS)
        for (who, source), p in pairs.items():
            scores.setdefault((condition[did], who, source), []).append(p.score)
    table = _cells(report, "<h3>Who echoes whom</h3>")
    assert len(table) == 2 * 12  # two conditions × the 12 ordered pairs of four seats
    for who, source, cond, n, mean, *_ in table:
        expected = scores[(cond, who, source)]
        assert int(n) == len(expected) == 2
        assert mean == f"{sum(expected) / 2:.3f}"

    per_pair = pd.read_parquet(eval_dir / "per_pair.parquet")
    assert len(per_pair) == 4 * 12
    assert (per_pair["relays"] == (per_pair["score"] >= ECHO_THRESHOLD)).all()
    row = per_pair.iloc[0]
    assert scores[(row["condition"], row["participant_id"], row["source_id"])].count(row["score"]) >= 1

    # Drift per client seat: the three client seats, not the facilitator.
    seat_drift = _cells(report, "<h3>Drift per client seat</h3>")
    assert {r[0] for r in seat_drift} == {"Ana", "Ben", "Carla"}


def test_a_group_run_reports_its_two_party_metrics_as_left_out(group_run: Path) -> None:
    metrics = load_metrics(group_run)
    note = "so the 4 group dialogue(s) are left out of them"
    assert metrics.group is not None and any(note in n for n in metrics.group.notes)
    assert any(note in n for n in metrics.drift.notes) and not metrics.drift.curves
    assert metrics.echoing.rates == [] and metrics.echoing.overall.n == 0
    assert metrics.separability == []
    per = pd.read_parquet(group_run / "eval" / "per_dialogue.parquet")
    # No two-party echoing verdict for a group dialogue: missing, not "no echoing".
    assert per["echoing"].isna().all() and per["echo_score"].isna().all()
    turns = pd.read_parquet(group_run / "turns.parquet")
    clients = turns[turns.role == "client"]
    assert metrics.counts.client_turns == len(clients) == 4 * 6
    assert dict(zip(per.dialogue_id, per.n_client_turns, strict=True)) == clients.groupby(
        "dialogue_id").size().to_dict()
    # Realism counts every client seat as the client side: MATTR of their words in order.
    mattr_client = dict(zip(per.dialogue_id, per.mattr_client, strict=True))
    for did, t in clients.sort_values("turn_index").groupby("dialogue_id"):
        tokens = [w for text in t.text for w in word_tokens(text)]
        assert mattr_client[did] == pytest.approx(_mattr(tokens))
    assert metrics.realism is not None and any("4 group dialogue(s)" in n for n in metrics.realism.notes)
    assert metrics.language is not None
    assert {s.side: s.n for s in metrics.language.stats if s.condition == "all"} == {
        "client": 4, "responder": 4}


def test_the_report_without_the_group_rows_still_renders(group_run: Path) -> None:
    metrics = load_metrics(group_run)
    per = pd.read_parquet(group_run / "eval" / "per_dialogue.parquet")
    page = render_report(metrics, per)
    assert "<h2>Group dialogues: role confusion</h2>" in page
    assert "No pairwise echo (per_pair.parquet not given)." in page


# --------------------------------------------------------------------------- per-role values


FAC, ANA, BEN = "Facilitator", "Ana", "Ben"
#: 80 words in a fixed pattern over 23 distinct ones, split over Ana's and Ben's turns.
WORDS = ["apple", "banana", "cherry", "daisy", "eagle", "falcon", "garden", "harbor", "island", "jungle",
         "kettle", "lemon", "meadow", "nickel", "orchard", "pepper", "quartz", "river", "saddle", "timber",
         "umbrella", "violet", "walnut"]
LEXICAL = [WORDS[(7 * i + i // 9) % len(WORDS)] for i in range(80)]
ENGLISH = "My landlord has ignored every single email I sent him this month."
GERMAN = "Ich habe seit Wochen Probleme mit meinem Vermieter und weiss nicht mehr weiter."
GERMAN_2 = "Das klingt wirklich schwer, erzählen Sie uns bitte mehr darüber."


def _lexical_turns() -> list[tuple[str, str]]:
    turns: list[tuple[str, str]] = [(FAC, "Hello all.")]
    for k in range(8):  # ten words a turn, Ana and Ben in turn
        turns.append((ANA if k % 2 == 0 else BEN, " ".join(LEXICAL[10 * k : 10 * k + 10])))
        if k == 3:
            turns.append((FAC, "Go on."))
    return turns


DIALOGUES: dict[str, list[tuple[str, str]]] = {
    "d-lex": _lexical_turns(),
    "d-diag": [(FAC, "Hello all."), (ANA, "apple banana cherry"), (BEN, "please apple"),
               (FAC, "Go on."), (ANA, "banana elderberry fig"), (BEN, "ugh date grape")],
    "d-lang": [(FAC, "Welcome everyone, who would like to start with how the week went?"),
               (ANA, ENGLISH), (BEN, GERMAN), (FAC, GERMAN_2), (ANA, GERMAN),
               (BEN, "Thank you both, it helps to hear that other people struggle too.")],
}
TWO_PARTY = [ENGLISH, "I am sorry to hear that, which letters did you send him?",
             "Three emails about the broken heating, and nothing came back."]


def _hand_made_run(run: Path, *, with_group: bool = True) -> Path:
    schema = load_schema(None)
    personas = [{"persona_id": "p-ana", "persona_index": 0, "card": "Ana rents a flat.", "concern": "rent"},
                {"persona_id": "p-ben", "persona_index": 1, "card": "Ben lives in Bonn.", "concern": "work",
                 "language": "de"}]
    dialogues: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    seats: list[dict[str, Any]] = []
    common = {"conversation_index": 0, "condition": "ecp", "pairing": "srv/srv", "client_backend": "srv",
              "client_model": "m", "responder_backend": "srv", "responder_model": "m", "seed": 1,
              "termination_reason": "max_utterances"}
    for did, said in DIALOGUES.items() if with_group else ():
        dialogues.append({"dialogue_id": did, "persona_id": "p-ana", "n_utterances": len(said), **common})
        turns += [{"dialogue_id": did, "turn_index": t, "speaker": who, "text": text,
                   "role": "responder" if who == FAC else "client",
                   "next_speaker_reason": "opener" if t == 0 else "round robin"}
                  for t, (who, text) in enumerate(said)]
        seats += [{"dialogue_id": did, "participant_id": pid, "position": i,
                   "role": "responder" if pid == FAC else "client",
                   "persona_id": {ANA: "p-ana", BEN: "p-ben"}.get(pid), "backend": "srv", "model": "m"}
                  for i, pid in enumerate([FAC, ANA, BEN])]
    # A two-party dialogue beside them: its speakers are its sides, its role is null.
    dialogues.append({"dialogue_id": "d-two", "persona_id": "p-ana", "n_utterances": 3, **common})
    turns += [{"dialogue_id": "d-two", "turn_index": t, "speaker": "client" if t % 2 == 0 else "responder",
               "text": text} for t, text in enumerate(TWO_PARTY)]
    tables: dict[str, list[dict[str, Any]]] = {"personas": personas, "dialogues": dialogues, "turns": turns}
    if seats:
        tables["participants"] = seats
    write_finished_run(run, tables, {"kind": "synthetic", "schema_version": "1.7"},
                       persona_fields=([*schema.field_names, "language"], schema.integer_fields()))
    return run


@pytest.fixture(scope="module")
def hand_made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pd.DataFrame]:
    run = _hand_made_run(tmp_path_factory.mktemp("hand") / "run")
    evaluate(run, embedder="lookup", progress=False)
    return run, pd.read_parquet(run / "eval" / "per_dialogue.parquet").set_index("dialogue_id")


def test_mattr_of_a_sequence_split_over_two_client_seats(hand_made: tuple[Path, pd.DataFrame]) -> None:
    _, per = hand_made
    row = per.loc["d-lex"]
    assert row["n_words_client"] == 80 and row["n_words_responder"] == 4
    # The client side is Ana's and Ben's words in dialogue order: the 80-word sequence itself.
    expected = _mattr(LEXICAL)
    assert row["mattr_client"] == pytest.approx(expected, abs=1e-12)
    ana = [w for k in range(0, 8, 2) for w in LEXICAL[10 * k : 10 * k + 10]]
    assert not math.isclose(expected, _mattr(ana))  # not one seat's words
    assert row["mattr_responder"] == pytest.approx(1.0)  # hello all go on
    counts = pd.Series(LEXICAL).value_counts()
    assert row["yules_k_client"] == pytest.approx(1e4 * ((counts**2).sum() - 80) / 80**2)


def test_client_diagnostics_over_the_client_seats(hand_made: tuple[Path, pd.DataFrame]) -> None:
    _, per = hand_made
    row = per.loc["d-diag"]
    # Client turns: Ana "apple banana cherry", Ben "please apple", Ana "banana elderberry fig",
    # Ben "ugh date grape".
    assert row["mattr_client"] == pytest.approx(9 / 11)  # 11 words, 9 types
    assert row["yules_k_client"] == pytest.approx(1e4 * (2 * 4 + 7 - 11) / 11**2)  # apple, banana twice
    # Front-loading per seat: Ana 3 of her 5 content words first, Ben 2 of 5; the mean.
    assert row["front_loading_client"] == pytest.approx((3 / 5 + 2 / 5) / 2)
    # Verbosity CV per seat: Ana [3, 3] words → 0, Ben [2, 3] → 0.5 / 2.5; the mean.
    assert row["verbosity_cv_client"] == pytest.approx((0 + 0.2) / 2)
    # Politeness and frustration over all four client turns: "please" once, "ugh" once.
    assert row["politeness_client"] == pytest.approx(1 / 4)
    assert row["frustration_client"] == pytest.approx(1 / 4)


def test_language_compliance_by_role_and_seat(hand_made: tuple[Path, pd.DataFrame]) -> None:
    run, per = hand_made
    row = per.loc["d-lang"]
    # Client side: Ana in English (hers) then German (flagged), Ben in German (his) then English
    # (flagged); responder side against the dialogue's persona (Ana's English): 1 of 2 flagged.
    assert row["language_compliance_client"] == pytest.approx(0.5) and row["off_language_client"] == 2
    assert row["language_compliance_responder"] == pytest.approx(0.5) and row["off_language_responder"] == 1
    assert row["language_expected"] == "de+en"
    metrics = load_metrics(run)
    assert metrics.language is not None and {"de", "en"} <= set(metrics.language.expected)
    flags = sorted((f.turn_index, f.speaker, f.expected, f.detected)
                   for f in metrics.language.flagged if f.dialogue_id == "d-lang")
    assert flags == [(3, FAC, "en", "de"), (4, ANA, "en", "de"), (5, BEN, "de", "en")]


def test_a_two_party_dialogue_beside_group_ones_keeps_its_values(
    hand_made: tuple[Path, pd.DataFrame], tmp_path: Path
) -> None:
    run, per = hand_made
    alone = _hand_made_run(tmp_path / "alone", with_group=False)
    evaluate(alone, embedder="lookup", progress=False)
    only = pd.read_parquet(alone / "eval" / "per_dialogue.parquet").set_index("dialogue_id").loc[
        "d-two"].to_dict()
    mixed = per.loc["d-two"].to_dict()
    assert mixed["echoing"] == only["echoing"] and mixed["echo_who"] == only["echo_who"]
    for column in ["n_client_turns", "drift_utterance", "echo_score", "mattr_client", "mattr_responder",
                   "front_loading_client", "verbosity_cv_client", "language_compliance_client"]:
        a, b = float(mixed[column]), float(only[column])
        assert (math.isnan(a) and math.isnan(b)) or a == b, column
    metrics = load_metrics(run)
    # Echoing and drift cover the two-party dialogue only, and say so.
    assert metrics.echoing.overall.n == 1
    assert metrics.group is not None and metrics.group.dialogues == 3
    assert any("they cover the run's 1 two-party dialogue(s) only" in n for n in metrics.drift.notes)
    assert per.loc[["d-lex", "d-diag", "d-lang"], "echoing"].isna().all()


# --------------------------------------------------------------------------- two-party runs

def test_a_two_party_runs_report_is_unchanged(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with TestServer() as srv:
        config = parse_config(endpoint_config(srv.base_url, personas={"n": 4}, conditions=["ecp", "concat"]),
                              "<test>")
        anyio.run(Engine(config, run, progress=False, sleep_scale=0).run)
    metrics = evaluate(run, embedder="lookup", progress=False)
    assert metrics.group is None
    eval_dir = run / "eval"
    assert [f.name for f in read_figures(eval_dir)] == TWO_PARTY_FIGURES
    assert not any((eval_dir / name).exists() for name in ("per_pair.parquet", "per_participant.parquet"))
    report = (eval_dir / "report.html").read_text(encoding="utf-8")
    assert "Group dialogues" not in report and "Two-party dialogues only" not in report
    stored = json.loads((eval_dir / "metrics.json").read_text(encoding="utf-8"))
    assert stored.get("group") is None
    per = pd.read_parquet(eval_dir / "per_dialogue.parquet")
    # Every two-party dialogue is measured by the two-party metrics (none skipped as a group's).
    assert per["echoing"].notna().all() and len(per) == 8
