"""Trials and reliability, end to end on the test server.

``spasm generate --trials K`` runs every planned dialogue K times, each trial with its own seed
(shared by the conditions of that trial, so they stay paired) and ``dialogues.trial``; resume,
shards and merge keep working; a run without trials plans the ids and seeds the golden run
pins (its bytes). ``spasm eval`` reports pass^k for k = 1..K by both
estimators, and the noise floor, in metrics.json and the report; the numbers are checked
against the goal verdicts read back from Parquet.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from spasm.cli import main
from spasm.dataset import open_run
from spasm.evaluation.loader import load_run
from spasm.evaluation.reliability import (
    _noise_floor,
    pass_hat_all_of_k,
    pass_hat_unbiased,
    reliability_metrics,
)
from spasm.runplan import plan
from spasm.testing import TestServer
from spasm.testing.replies import default_reply
from tests.conftest import config_from, endpoint_config, make_persona
from tests.test_scenarios import GOAL_JUDGE
from tests.test_shards import sorted_rows

SCENARIOS = [
    {"id": "late", "situation": "Your order is two weeks late.", "goal": "Get a new date.",
     "expected_outcome": "The agent gives a date."},
    {"id": "refund", "situation": "You were charged twice.", "goal": "Get one charge back.",
     "expected_outcome": "The agent refunds one charge."},
]


def _judge_by_seed(body: dict[str, Any]) -> str:
    """The goal judge's verdict depends on the call's seed (the trial's), so trials differ."""
    if GOAL_JUDGE in str(body["messages"][0].get("content", "")):
        met = int(body.get("seed") or 0) % 3 != 0
        return json.dumps({"goal_met": met, "reason": "by seed"})
    return default_reply(body)


@pytest.fixture(scope="module")
def server() -> Any:
    with TestServer(reply=_judge_by_seed) as srv:
        yield srv


def _config(tmp: Path, base_url: str, **overrides: Any) -> str:
    data = endpoint_config(base_url, personas={"n": 2}, scenarios=SCENARIOS,
                           conditions=["ecp", "concat"], **overrides)
    path = tmp / "run.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


def _generate(config: str, out: Path, *extra: str) -> int:
    return main(["generate", "--config", config, "--out", str(out), "--no-progress", *extra])


@pytest.fixture(scope="module")
def trial_run(tmp_path_factory: pytest.TempPathFactory, server: TestServer) -> Path:
    tmp = tmp_path_factory.mktemp("trials")
    out = tmp / "run"
    assert _generate(_config(tmp, server.base_url), out, "--trials", "3") == 0
    return out


@pytest.mark.e2e
def test_every_planned_dialogue_runs_k_times_with_its_own_paired_seed(trial_run: Path) -> None:
    dialogues = open_run(trial_run).dialogues
    assert len(dialogues) == 2 * 2 * 2 * 3  # personas × scenarios × conditions × trials
    schema = pq.read_schema(next((trial_run / "dialogues.parquet").glob("*.parquet")))
    assert schema.names[-1] == "trial" and schema.names[-4:-1] == ["scenario_id", "goal_met",
                                                                   "goal_reason"]
    assert sorted(set(dialogues.trial)) == [0, 1, 2]
    assert all(d.endswith(f"-t{t}") for d, t in zip(dialogues.dialogue_id, dialogues.trial,
                                                    strict=True))
    dialogues["base"] = [d.rsplit("-t", 1)[0] for d in dialogues.dialogue_id]
    dialogues["task"] = [b.rsplit("-", 1)[0] for b in dialogues.base]  # less the condition
    # Each task's trials have distinct seeds; both conditions of one trial share it.
    for _, task in dialogues.groupby("task"):
        by_trial = task.groupby("trial").seed.nunique()
        assert (by_trial == 1).all()
        assert task.drop_duplicates("trial").seed.nunique() == 3
    assert dialogues.seed.nunique() == 2 * 2 * 3
    # The trials really differ: the test server's replies depend on the seed.
    turns = open_run(trial_run).turns
    first = turns[turns.turn_index == 0].merge(dialogues[["dialogue_id", "base", "trial"]])
    assert first.groupby("base").text.nunique().max() > 1


def test_a_run_without_trials_plans_the_same_ids_and_seeds_as_before(server: TestServer) -> None:
    data = endpoint_config(server.base_url, personas={"n": 2}, scenarios=SCENARIOS)
    personas = [make_persona(f"p{i}", i, "c") for i in range(2)]
    before = [(s.dialogue_id, s.seed, s.trial) for s in plan(config_from(data), personas)]
    once = [(s.dialogue_id, s.seed, s.trial)
            for s in plan(config_from({**data, "trials": 1}), personas)]
    assert once == before and all(t is None for _, _, t in before)
    assert config_from({**data, "trials": 1}).fingerprint() == config_from(data).fingerprint()
    three = list(plan(config_from({**data, "trials": 3}), personas))
    assert [s.dialogue_id for s in three[:3]] == [f"{before[0][0]}-t{t}" for t in range(3)]


@pytest.mark.e2e
def test_a_resumed_run_with_trials_equals_the_uninterrupted_one(
    tmp_path: Path, server: TestServer, trial_run: Path
) -> None:
    cfg = _config(tmp_path, server.base_url)
    run = tmp_path / "run"
    assert _generate(cfg, run, "--trials", "3", "--dry-run", "--pilot", "2") == 0
    assert len(open_run(run).dialogues) == 2
    assert _generate(cfg, run, "--trials", "3") == 0
    for table in ("personas", "dialogues", "turns"):
        pd.testing.assert_frame_equal(sorted_rows(run, table), sorted_rows(trial_run, table))
    # The trial count is part of what the run holds: resuming with another is refused.
    assert _generate(cfg, run, "--trials", "2") == 2


@pytest.mark.e2e
def test_shards_of_a_run_with_trials_merge_into_the_whole_run(
    tmp_path: Path, server: TestServer, trial_run: Path
) -> None:
    cfg = _config(tmp_path, server.base_url)
    shards = [tmp_path / f"shard{i}" for i in range(2)]
    for i, out in enumerate(shards):
        assert _generate(cfg, out, "--trials", "3", "--shard", f"{i}/2") == 0
    assert main(["merge", *map(str, shards), "--out", str(tmp_path / "merged")]) == 0
    for table in ("personas", "dialogues", "turns"):
        pd.testing.assert_frame_equal(sorted_rows(tmp_path / "merged", table),
                                      sorted_rows(trial_run, table))


def test_trials_out_of_range_are_exit_2_naming_the_flag(
    tmp_path: Path, server: TestServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _generate(_config(tmp_path, server.base_url), tmp_path / "x", "--trials", "0") == 2
    err = capsys.readouterr().err
    assert "--trials (trials)" in err and "Traceback" not in err


def _expected(dialogues: pd.DataFrame, condition: str, k: int) -> tuple[float, float]:
    """pass^k of a condition by both estimators, computed here from the stored verdicts."""
    rows = dialogues[dialogues.condition == condition].sort_values("trial")
    unbiased, groups = [], []
    for _, task in rows.groupby(rows.dialogue_id.str.rsplit("-t", n=1).str[0]):
        outcomes = task.goal_met.astype(bool).tolist()
        unbiased.append(math.comb(sum(outcomes), k) / math.comb(len(outcomes), k))
        groups += [all(outcomes[g * k:(g + 1) * k]) for g in range(len(outcomes) // k)]
    return float(np.mean(unbiased)), float(np.mean(groups))


@pytest.mark.e2e
def test_eval_reports_pass_hat_k_by_both_estimators_and_the_noise_floor(
    trial_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["eval", str(trial_run), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "Reliability (ecp, 4 tasks): pass^1 " in printed and "noise floor" in printed
    metrics = json.loads((trial_run / "eval" / "metrics.json").read_text())
    r = metrics["reliability"]
    assert r["outcome"] == "goal_met" and r["trials"] == 3 and r["tasks"] == 2 * 2 * 2
    assert set(r["estimators"]) == {"unbiased", "all_of_k"}
    dialogues = open_run(trial_run).dialogues
    assert dialogues.goal_met.notna().all() and 0 < dialogues.goal_met.mean() < 1
    overall = {row["condition"]: row for row in r["rows"] if row["scenario_id"] == "all"}
    assert set(overall) == {"ecp", "concat"}
    for condition, row in overall.items():
        assert [p["k"] for p in row["pass_hat"]] == [1, 2, 3]
        for p in row["pass_hat"]:
            unbiased, all_of_k = _expected(dialogues, condition, p["k"])
            assert p["unbiased"] == pytest.approx(unbiased)
            assert p["all_of_k"] == pytest.approx(all_of_k)
            assert p["noise_floor"] is not None and 0 <= p["noise_floor"] <= 1
        # pass^k never rises with k (every k-subset must succeed).
        values = [p["unbiased"] for p in row["pass_hat"]]
        assert values == sorted(values, reverse=True)
    per_scenario = {(row["condition"], row["scenario_id"]) for row in r["rows"]}
    assert {("ecp", "late"), ("ecp", "refund"), ("concat", "late")} <= per_scenario
    per_dialogue = pd.read_parquet(trial_run / "eval" / "per_dialogue.parquet")
    assert sorted(set(per_dialogue.trial)) == [0, 1, 2]
    html = (trial_run / "eval" / "report.html").read_text(encoding="utf-8")
    assert "Reliability over trials (pass^k)" in html and "pass^3" in html and "floor^3" in html


def test_the_estimators_on_known_trials() -> None:
    tasks = [[True, True, False], [True, True, True], [False, False, False]]
    assert pass_hat_unbiased(tasks, 1) == (pytest.approx((2 / 3 + 1 + 0) / 3), 3)
    assert pass_hat_unbiased(tasks, 2) == (pytest.approx((1 / 3 + 1 + 0) / 3), 3)
    assert pass_hat_unbiased(tasks, 3) == (pytest.approx(1 / 3), 3)
    assert pass_hat_unbiased(tasks, 4) == (None, 0)
    # all-of-k cuts each task's trials in order: [T,T] passes, [F] left over at k = 2.
    assert pass_hat_all_of_k(tasks, 2) == (pytest.approx(2 / 3), 3)
    assert pass_hat_all_of_k(tasks, 3) == (pytest.approx(1 / 3), 3)
    assert pass_hat_all_of_k([[True, False, True, True]], 2) == (pytest.approx(0.5), 2)


def test_the_noise_floor_is_zero_without_spread_and_shrinks_with_more_tasks() -> None:
    rng = np.random.default_rng(0)
    assert _noise_floor([[True] * 4] * 10, [1, 4], rng) == [0.0, 0.0]
    assert _noise_floor([[True, False]], [1], rng)[0] == 1.0  # 2 trials: 0 vs 1 happens
    assert _noise_floor([[True] * 4] * 3, [5], rng) == [None]  # no task has 5 trials
    mixed = [[True, False, True, False], [True, True, True, True], [False] * 4,
             [True, True, False, True]]
    small = _noise_floor(mixed, [1], np.random.default_rng(1))[0]
    large = _noise_floor(mixed * 16, [1], np.random.default_rng(1))[0]
    assert small is not None and large is not None and 0 < large < small


def test_a_run_without_trials_has_no_reliability_section(tmp_path: Path) -> None:
    from spasm.dataset.synthetic import synthesize_run

    run = synthesize_run(tmp_path / "run", n_dialogues=8, n_personas=2)
    data = load_run(run)
    assert all(c.trial is None for c in data.conversations)
    assert reliability_metrics(data.conversations) is None
    assert "trial" not in pq.read_schema(next((run / "dialogues.parquet").glob("*"))).names


def test_a_group_run_with_trials_runs_each_group_dialogue_k_times(
    tmp_path: Path, server: TestServer
) -> None:
    from tests.test_group import _group_data

    data = {**_group_data(server.base_url), "scenarios": SCENARIOS[:1], "trials": 2}
    data["personas"] = {"n": 3}
    path = tmp_path / "group.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    assert _generate(str(path), tmp_path / "run") == 0
    run = open_run(tmp_path / "run")
    dialogues = run.dialogues
    assert sorted(dialogues.dialogue_id) == sorted(
        f"g0000-slate-{c}-t{t}" for c in ("ecp", "concat") for t in (0, 1))
    assert dialogues.groupby("trial").seed.nunique().tolist() == [1, 1]
    assert dialogues.seed.nunique() == 2
    assert set(run.df("participants").dialogue_id) == set(dialogues.dialogue_id)
    convs = load_run(tmp_path / "run").conversations
    metrics = reliability_metrics(convs)
    assert metrics is not None and metrics.tasks == 2 and metrics.trials == 2
