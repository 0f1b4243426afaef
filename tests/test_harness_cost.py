"""The scripted checker profile: the harness's checker passes drafts and rewrites at set rates."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import anyio
import pandas as pd
import pytest

from spasm.engine import Engine
from spasm.harness.state import StateUpdate, apply_update, initial_responder_state
from spasm.harness.stimulus import needs_reducer, no_stimulus
from spasm.testing import TestServer
from spasm.testing.checker_profile import CheckerProfile, is_checker_request
from tests.conftest import config_from, endpoint_config


def _check_body(turn: str, candidate: str) -> dict[str, Any]:
    schema = {"title": "CheckerOutput", "type": "object"}
    return {
        "messages": [{"role": "system", "content": "You review one message."},
                     {"role": "user", "content": f"{turn}\n\nMessage to review: {candidate}"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
    }


def _passes(profile: CheckerProfile, turn: str, candidate: str) -> bool:
    body = _check_body(turn, candidate)
    assert is_checker_request(body)
    reply = json.loads(profile(body))
    return bool(reply["dimension_scores"]["boundary"] >= 90)


def test_the_profile_passes_drafts_and_rewrites_at_its_rates_by_seed() -> None:
    profile = CheckerProfile(0.85, 0.12, seed=5)
    outcomes = []
    for i in range(3000):
        turn = f"The other person just said: line {i}"
        if _passes(profile, turn, "draft"):
            outcomes.append("first")
        else:
            outcomes.append("rewrite" if _passes(profile, turn, "rewrite") else "flagged")
    shares = {k: outcomes.count(k) / len(outcomes) for k in ("first", "rewrite", "flagged")}
    assert shares["first"] == pytest.approx(0.85, abs=0.02)
    assert shares["rewrite"] == pytest.approx(0.12, abs=0.02)
    assert shares["flagged"] == pytest.approx(0.03, abs=0.01)
    assert profile.counts["first_pass"] == outcomes.count("first")
    # Same seed, same outcomes; another seed draws others.
    again = CheckerProfile(0.85, 0.12, seed=5)
    other = CheckerProfile(0.85, 0.12, seed=6)
    turns = [f"The other person just said: line {i}" for i in range(200)]
    assert [again.outcome(t) for t in turns] == [profile.outcome(t) for t in turns]
    assert [other.outcome(t) for t in turns] != [profile.outcome(t) for t in turns]


def test_the_profile_rejects_rates_over_one() -> None:
    with pytest.raises(ValueError):
        CheckerProfile(0.9, 0.2)


def _run(tmp: Path, seed: int) -> tuple[pd.DataFrame, CheckerProfile]:
    profile = CheckerProfile(0.7, 0.2, seed=seed)
    with TestServer(reply=profile) as srv:
        config = endpoint_config(
            srv.base_url, personas={"n": 2}, dialogue={"max_turns_per_agent": 5, "max_tokens": 40},
            termination={"rules": False}, harness={"client": "E", "responder": "E"},
        )
        summary = anyio.run(Engine(config_from(config), tmp, progress=False, sleep_scale=0.0).run)
    assert summary.completed == summary.planned
    turns = pd.read_parquet(tmp / "turns.parquet").sort_values(["dialogue_id", "turn_index"])
    return turns, profile


def test_a_harness_run_on_the_profile_rewrites_and_flags_the_turns_it_drew(tmp_path: Path) -> None:
    turns, profile = _run(tmp_path / "a", seed=1)
    # Every turn's draft reached the checker model (no code screen fired on the scripted text).
    assert len(turns) == 20
    assert profile.counts["first_pass"] + profile.counts["after_rewrite"] + profile.counts["flagged"] == 20
    assert int((turns.attempts == 1).sum()) == profile.counts["first_pass"]
    assert int((turns.attempts == 2).sum()) == profile.counts["after_rewrite"] + profile.counts["flagged"]
    assert int(turns.flagged.sum()) == profile.counts["flagged"]
    assert profile.counts["after_rewrite"] > 0 and profile.counts["flagged"] > 0  # seed 1 draws both
    assert profile.counts["checks"] == 20 + int((turns.attempts == 2).sum())
    again, _ = _run(tmp_path / "b", seed=1)
    assert again.attempts.tolist() == turns.attempts.tolist()
    assert again.flagged.tolist() == turns.flagged.tolist()


def test_the_reducer_screen_calls_the_model_only_when_a_message_could_move_the_state() -> None:
    assert not needs_reducer("You: Okay. I paid for express delivery.\nThe client: My number is 42.")
    assert needs_reducer("The client: I am really worried about the bill.")
    assert needs_reducer("The client: This is the third time!")
    assert needs_reducer("The client: Thanks, that is sorted then.")


def test_a_skipped_reduction_is_the_constraints_no_stimulus_step() -> None:
    state = initial_responder_state("agent").with_values({"emotion.joy": 90, "relation.trust": 60})
    lines = "You: Okay.\nThe client: My number is 42."
    skipped = no_stimulus(state, lines)
    asked = apply_update(state, StateUpdate(stimulus=False), lines)
    assert skipped.state == asked.state and not skipped.fallback and not skipped.clips
    # The extreme value decays by 10 toward 50 in code; the moderate one stays.
    assert skipped.state.value("emotion.joy") == 80 and skipped.state.value("relation.trust") == 60
    assert [c.dimension for c in skipped.decays] == ["emotion.joy"]


def test_turns_without_a_cue_make_no_reducer_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("spasm.harness.runtime.REDUCER_SCREEN", True)
    profile = CheckerProfile(1.0, 0.0, seed=3)
    with TestServer(reply=profile) as srv:
        config = endpoint_config(
            srv.base_url, personas={"n": 1}, dialogue={"max_turns_per_agent": 8, "max_tokens": 40},
            termination={"rules": False}, harness={"client": "C", "responder": "C"},
        )
        anyio.run(Engine(config_from(config), tmp_path, progress=False, sleep_scale=0.0).run)
        reducer_inputs = [b["messages"][-1]["content"] for b in srv.requests
                          if "You track the inner state" in str(b["messages"][0]["content"])]
    turns = pd.read_parquet(tmp_path / "turns.parquet")
    # Every turn after each agent's first has a reduction; some were decided in code.
    assert 0 < len(reducer_inputs) < len(turns) - 2
    assert all(needs_reducer(text.split("Latest messages:\n", 1)[1]) for text in reducer_inputs)
    assert turns.state.notna().all()


def _cost(tmp: Path, utterances: int, variant: str = "default") -> dict[str, Any]:
    """benchmarks/harness_cost.py's measurement: 3 personas, 45-word turns, tiktoken counts and
    the server's prefix cache, levels A and E on the same personas and seeds."""
    from benchmarks.harness_cost import measure

    args = argparse.Namespace(first_pass=0.85, after_rewrite=0.12, seed=2026, personas=3,
                              cache_discount=0.5, reply_words=45, tokens="tiktoken",
                              no_prefix_cache=False)
    return measure(utterances, args, tmp, variant)


@pytest.mark.e2e
def test_level_e_stays_within_its_token_budget_on_long_dialogues(tmp_path: Path) -> None:
    """The harness design's cost targets at its checker rates: E ≤ 1.25 × A's tokens
    at 50 utterances and ≤ 1.0 × at 100 (raw, as the server reports them), ≤ 1.5 × at 100
    with cached prompt tokens at half price; the merged review costs less than two calls."""
    at50, at100 = _cost(tmp_path, 50), _cost(tmp_path, 100)
    assert at50["cost_source"] == "api"
    assert at50["raw_ratio"] <= 1.25
    assert at100["raw_ratio"] <= 1.0
    assert at100["cache_adjusted_ratio"] <= 1.5
    merged = _cost(tmp_path, 50, "merged")
    assert "reducer" not in merged["calls_per_role_E"]
    assert merged["raw_ratio"] < at50["raw_ratio"]
