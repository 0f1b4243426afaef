"""The simulated user's errors, LLM-judged (``spasm eval --simulator-errors``).

A run with scenarios on the test server, then ``spasm eval --simulator-errors`` with the run's
own backend as the judge, over real HTTP: every two-party dialogue gets one review call (role
``eval_simulator``, logged in calls.parquet, cached), seeing the Client's instructions, the
scenario's expected outcome and the recorded outcome; tags and severities are τ²'s closed
vocabulary (an unknown tag is re-asked, then a fallback); errors on a Responder turn are
dropped; the share of failed dialogues with a critical simulator error, by condition, is
checked against the verdicts read back from Parquet.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from spasm.cli import main
from spasm.dataset import open_run
from spasm.evaluation.simulator import SIMULATOR_ROLE, SimulatorReview
from spasm.testing import TestServer
from spasm.testing.replies import default_reply
from tests.test_scenarios import GOAL_JUDGE
from tests.test_trials import SCENARIOS

REVIEW = "You review a SIMULATED USER"


def _reply(body: dict[str, Any]) -> str:
    system = str(body["messages"][0].get("content", ""))
    if GOAL_JUDGE in system:  # met on even seeds: some dialogues fail
        met = int(body.get("seed") or 0) % 2 == 0
        return json.dumps({"goal_met": met, "reason": "by seed"})
    if REVIEW not in system:
        return default_reply(body)
    prompt = " ".join(str(m.get("content", "")) for m in body["messages"][1:])  # re-asks too
    if "the goal was not met" in prompt:  # a critical error, and one on the agent's turn
        return json.dumps({"errors": [
            {"turn": 0, "tags": ["hallucination", "missed_required_action"],
             "severity": "critical_hindered", "reason": "invents an order number"},
            {"turn": 1, "tags": ["other"], "severity": "minor", "reason": "the agent's turn"},
        ], "summary": "the user invented facts"})
    if "charged twice" in prompt:  # outside the vocabulary, every time: a fallback
        return json.dumps({"errors": [{"turn": 0, "tags": ["made_up"], "severity": "minor"}]})
    return json.dumps({"errors": [{"turn": 2, "tags": ["inconsistent_behavior"],
                                   "severity": "minor", "reason": "changes its story"}],
                       "summary": "fine"})


@pytest.fixture(scope="module")
def server() -> Any:
    with TestServer(reply=_reply) as srv:
        yield srv


@pytest.fixture(scope="module")
def reviewed(tmp_path_factory: pytest.TempPathFactory, server: TestServer) -> Path:
    from tests.conftest import endpoint_config

    tmp = tmp_path_factory.mktemp("simerr")
    data = endpoint_config(server.base_url, personas={"n": 3}, scenarios=SCENARIOS,
                           conditions=["ecp", "concat"])
    (tmp / "run.json").write_text(json.dumps(data), encoding="utf-8")
    run = tmp / "run"
    assert main(["generate", "--config", str(tmp / "run.json"), "--out", str(run),
                 "--no-progress"]) == 0
    server.reset()
    assert main(["eval", str(run), "--no-progress", "--simulator-errors"]) == 0
    return run


@pytest.mark.e2e
def test_every_dialogue_is_reviewed_through_the_one_call_path(
    reviewed: Path, server: TestServer
) -> None:
    dialogues = open_run(reviewed).dialogues
    asked = [b for b in server.requests if REVIEW in str(b["messages"][0].get("content", ""))]
    refund = dialogues.scenario_id == "refund"
    fallbacks = int((refund & dialogues.goal_met).sum())
    assert len(asked) == len(dialogues) + fallbacks  # one re-ask per invalid reply
    # The judge sees the Client's own instructions, the expected outcome and the outcome.
    late = next(b for b in asked if "two weeks late" in b["messages"][1]["content"])
    prompt = late["messages"][1]["content"]
    assert "Expected outcome of the scenario: The agent gives a date." in prompt
    assert "Recorded outcome: the goal was" in prompt and "[0] CLIENT:" in prompt
    assert dialogues.client_system_prompt.iloc[0].strip()[:40] in "".join(
        b["messages"][1]["content"] for b in asked)
    calls = open_run(reviewed).calls
    mine = calls[calls.role == SIMULATOR_ROLE]
    assert len(mine) == len(asked) and set(mine.dialogue_id) == set(dialogues.dialogue_id)


@pytest.mark.e2e
def test_the_share_of_failed_dialogues_with_a_critical_error_by_condition(reviewed: Path) -> None:
    metrics = json.loads((reviewed / "eval" / "metrics.json").read_text())
    s = metrics["simulator_errors"]
    dialogues = open_run(reviewed).dialogues
    invalid = (dialogues.scenario_id == "refund") & dialogues.goal_met
    failed = ~dialogues.goal_met.astype(bool)
    assert 0 < failed.sum() < len(dialogues)
    assert s["fallbacks"] == int(invalid.sum()) and s["reviewed"] == len(dialogues) - s["fallbacks"]
    assert s["misplaced"] == int(failed.sum())  # the Responder-turn error of each failure
    assert set(s["tags"]) >= {"hallucination", "revealed_info_early", "premature_termination",
                              "missed_required_action"}
    assert set(s["severities"]) == {"critical_helped", "critical_hindered", "minor"}
    rates = {(r["pairing"], r["condition"]): r for r in s["rates"]}
    assert set(rates) == {("all", "all"), ("all", "ecp"), ("all", "concat")}
    for condition in ("ecp", "concat"):
        r = rates[("all", condition)]
        mine = dialogues[(dialogues.condition == condition) & ~invalid]
        n_failed = int((~mine.goal_met.astype(bool)).sum())
        assert r["n"] == len(mine) and r["failed"] == n_failed
        assert r["failed_critical"] == n_failed and r["critical_hindered"] == n_failed
        assert r["failed_critical_share"] == (1.0 if n_failed else None)
        assert r["passed"] == len(mine) - n_failed and r["passed_helped"] == 0
        assert r["tags"].get("hallucination", 0) == n_failed
    per_dialogue = pd.read_parquet(reviewed / "eval" / "per_dialogue.parquet").set_index("dialogue_id")
    for did, row in dialogues.set_index("dialogue_id").iterrows():
        got = per_dialogue.loc[did]
        if invalid[dialogues.dialogue_id == did].item():
            assert pd.isna(got.sim_critical)
        else:
            assert got.sim_critical == (0.0 if row.goal_met else 1.0)
            assert got.sim_errors == 1
    html = (reviewed / "eval" / "report.html").read_text(encoding="utf-8")
    assert "The simulated user&#x27;s errors (LLM-judged)" in html or \
        "The simulated user's errors (LLM-judged)" in html
    assert "critical_hindered" in html and "invents an order number" in html


@pytest.mark.e2e
def test_a_second_evaluation_is_answered_from_the_cache(reviewed: Path, server: TestServer) -> None:
    server.reset()
    assert main(["eval", str(reviewed), "--no-progress", "--simulator-errors"]) == 0
    assert not [b for b in server.requests if REVIEW in str(b["messages"][0].get("content", ""))]
    metrics = json.loads((reviewed / "eval" / "metrics.json").read_text())
    assert metrics["llm"]["cache_hits"] == metrics["llm"]["calls"] > 0


def test_the_review_schema_holds_the_closed_vocabulary() -> None:
    ok = SimulatorReview.model_validate_json(
        '{"errors": [{"turn": 0, "tags": ["premature_termination"], "severity": "critical_helped"}]}')
    assert ok.errors[0].severity == "critical_helped"
    for bad in ('{"errors": [{"turn": 0, "tags": ["made_up"], "severity": "minor"}]}',
                '{"errors": [{"turn": 0, "tags": [], "severity": "minor"}]}',
                '{"errors": [{"turn": 0, "tags": ["other"], "severity": "critical"}]}'):
        with pytest.raises(ValueError):
            SimulatorReview.model_validate_json(bad)


def test_llm_options_without_an_llm_stage_are_exit_2_naming_simulator_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    assert main(["eval", str(run), "--llm-backend", "embedded"]) == 2
    err = capsys.readouterr().err
    assert "--simulator-errors" in err and "Traceback" not in err


def test_the_judge_sees_every_tool_event_before_the_utterance_it_belongs_to() -> None:
    from spasm.evaluation.loader import Conversation
    from spasm.evaluation.simulator import ReviewContext, review_messages
    from spasm.history import Event

    conv = Conversation("d", "p", 0, "ecp", "a/b", "A", ("client", "responder", "client"),
                        ("Where is order 7?", "It shipped.", "Thanks."), goal_met=True)
    events = [Event("tool_call", "responder", 1, ("responder",), "c1", "find", '{"id": "7"}'),
              Event("notice", "responder", 1, ("client",), "c1", "find", notice="[Looking]"),
              Event("tool_result", "responder", 1, ("responder",), "c1", "find",
                    result='{"status": "shipped"}'),
              Event("tool_call", "client", 2, ("client",), "c2", "bank", "{}")]
    text = review_messages(conv, ReviewContext("You are Ana."), events)[1]["content"]
    lines = text.split("Conversation:\n\n")[1].split("\n\n")
    assert lines == ["[0] CLIENT: Where is order 7?",
                     '    RESPONDER (calls find): {"id": "7"}',
                     '    RESPONDER (result of find): {"status": "shipped"}',
                     "[1] RESPONDER: It shipped.",
                     "    CLIENT (calls bank): {}",
                     "[2] CLIENT: Thanks."]
    assert "[Looking]" not in text  # the payloads themselves, not what the Client was shown
