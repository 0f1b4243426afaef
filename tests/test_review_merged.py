"""Level E with ``harness.review: merged``: the checker's call also updates the state."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pandas as pd

from spasm.engine import Engine
from spasm.testing import TestServer
from spasm.testing.checker_profile import CheckerProfile
from spasm.testing.server import default_reply
from tests.conftest import config_from, endpoint_config

_PASS = {"dimension_scores": {"boundary": 95, "fact": 90, "state": 90, "style": 90},
         "violations": [], "correction_advice": ""}


def _title(body: dict[str, Any]) -> str | None:
    fmt = body.get("response_format") or {}
    schema = (fmt.get("json_schema") or {}).get("schema") or fmt.get("schema") or {}
    return schema.get("title") if isinstance(schema, dict) else None


def _run(tmp: Path, reply: Any, review: str = "merged", turns_per_agent: int = 4
         ) -> tuple[pd.DataFrame, pd.DataFrame, list[dict[str, Any]]]:
    with TestServer(reply=reply) as srv:
        config = endpoint_config(
            srv.base_url, personas={"n": 1},
            dialogue={"max_turns_per_agent": turns_per_agent, "max_tokens": 40},
            termination={"rules": False}, engine={"cache": False},
            harness={"client": "E", "responder": "E", "review": review, "extract_policy": False},
        )
        summary = anyio.run(Engine(config_from(config), tmp, progress=False, sleep_scale=0.0).run)
        requests = list(srv.requests)
    assert summary.completed == summary.planned
    turns = pd.read_parquet(tmp / "turns.parquet").sort_values("turn_index")
    calls = pd.read_parquet(tmp / "calls.parquet")
    return turns, calls, requests


def test_merged_review_makes_one_harness_call_a_turn_and_no_reducer_call(tmp_path: Path) -> None:
    turns, calls, requests = _run(tmp_path / "m", CheckerProfile(1.0, 0.0, seed=2))
    roles = calls.role.value_counts().to_dict()
    assert "reducer" not in roles
    assert roles["checker"] == len(turns) == 8
    reviews = [b for b in requests if _title(b) == "ReviewOutput"]
    assert len(reviews) == 8
    # The reducer's task is in the stable system part; the whole state in the turn's part.
    assert "track the inner state" in reviews[0]["messages"][0]["content"]
    assert "Current state:\nemotion:" in reviews[0]["messages"][1]["content"]
    assert turns.state.notna().all()
    separate_turns, separate, _ = _run(tmp_path / "s", CheckerProfile(1.0, 0.0, seed=2), "separate")
    assert separate.role.value_counts()["reducer"] > 0
    # The scripted text depends only on the seed: both designs run the same conversation.
    assert separate_turns.text.tolist() == turns.text.tolist()


def test_the_merged_update_is_applied_under_the_hard_constraints(tmp_path: Path) -> None:
    """The review proposes joy 95 quoting the reviewed reply, and trust 90 quoting nothing
    said: the step limit holds joy to +20, the evidence rule trust to +10."""

    def reply(body: dict[str, Any]) -> str:
        if _title(body) != "ReviewOutput":
            return default_reply(body) if body.get("response_format") else "Fine then, thank you kindly."
        update = {"stimulus": True, "strategy": "Keep it short.", "new_belief": "", "drift_detected": False,
                  "changes": [{"dimension": "emotion.joy", "value": 95, "evidence": "thank you kindly"},
                              {"dimension": "relation.trust", "value": 90, "evidence": "never said"}]}
        return json.dumps({**_PASS, "state_update": update})

    turns, _, _ = _run(tmp_path, reply, turns_per_agent=2)
    client = turns[turns.speaker == "client"]
    first_state = json.loads(client.state.iloc[0])
    log = json.loads(client.state_log.iloc[0])
    reasons = {c["dimension"]: c["reason"] for c in log["clips"]}
    assert reasons == {"emotion.joy": "step", "relation.trust": "evidence"}
    joy = {c["dimension"]: c for c in log["clips"]}["emotion.joy"]
    assert joy["applied"] == joy["previous"] + 20
    assert first_state["strategy"] == "Keep it short."
    assert (client.state_clips == 2).all()


def test_an_unusable_review_keeps_the_state_and_flags_the_turn(tmp_path: Path) -> None:
    def reply(body: dict[str, Any]) -> str:
        if _title(body) == "ReviewOutput":
            return "not json at all"
        return default_reply(body) if body.get("response_format") else "Fine then, thank you kindly."

    turns, _, _ = _run(tmp_path, reply, turns_per_agent=2)
    assert (turns.flag_reason == "checker_unavailable").all()
    assert (turns.harness_fallbacks >= 1).all()
    client = turns[turns.speaker == "client"]
    states = [json.loads(s) for s in client.state]
    assert states[0]["emotions"] == states[1]["emotions"]  # nothing moved it
    assert all(json.loads(x)["fallback"] for x in client.state_log)
