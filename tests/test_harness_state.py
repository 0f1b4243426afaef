"""The reducer's hard constraints, on crafted state sequences (no model involved)."""

from __future__ import annotations

import json
from itertools import pairwise

import pytest

from spasm.harness.state import (
    DIMENSIONS,
    AgentState,
    Change,
    Emotions,
    Goal,
    StateUpdate,
    apply_update,
    constrain,
    evidence_in,
    initial_client_state,
    salient_items,
)
from tests.conftest import make_persona

RECENT = "You: My washer broke again.\nThe agent: I am so sorry, we will replace it for free today."


def _state(**emotions: int) -> AgentState:
    return AgentState(
        goals=[Goal(description="Get the washer fixed", priority=90, progress=20)],
        emotions=Emotions(**emotions),
    )


def _update(*changes: tuple[str, int, str], stimulus: bool = True) -> StateUpdate:
    return StateUpdate(
        stimulus=stimulus,
        changes=[Change(dimension=d, value=v, evidence=e) for d, v, e in changes],  # type: ignore[arg-type]
    )


def test_a_jump_of_60_is_capped_at_20_even_with_evidence() -> None:
    prev = _state(joy=30)
    r = apply_update(prev, _update(("emotion.joy", 90, "we will replace it for free")), RECENT)
    assert r.state.emotions.joy == 50
    assert [(c.dimension, c.previous, c.proposed, c.applied, c.reason) for c in r.clips] == [
        ("emotion.joy", 30, 90, 50, "step")
    ]
    # Downwards too.
    r = apply_update(_state(trust=65), _update(("emotion.trust", 5, "my washer broke again")), RECENT)
    assert r.state.emotions.trust == 45 and r.clips[0].reason == "step"


def test_a_change_over_10_without_evidence_is_clipped_to_10() -> None:
    for evidence in ("", "the agent was rude to me", "ok"):  # missing, invented, too short
        r = apply_update(_state(anger=40), _update(("emotion.anger", 70, evidence)), RECENT)
        assert r.state.emotions.anger == 50, evidence
        assert r.clips[0].reason == "evidence"
    # A quote differing only in case, punctuation and spacing counts.
    r = apply_update(_state(anger=40), _update(("emotion.anger", 58, "  MY WASHER broke, again! ")),
                     RECENT)
    assert r.state.emotions.anger == 58 and r.clips == []
    # Small changes need no evidence.
    r = apply_update(_state(anger=40), _update(("emotion.anger", 50, "")), RECENT)
    assert r.state.emotions.anger == 50 and r.clips == []


def test_no_stimulus_makes_extremes_decay_10_toward_50() -> None:
    prev = _state(anger=90, joy=10, fear=75, sadness=25, trust=55, surprise=72)
    r = apply_update(prev, StateUpdate(stimulus=False), RECENT)
    e = r.state.emotions
    assert (e.anger, e.joy, e.fear, e.sadness, e.trust, e.surprise) == (80, 20, 65, 35, 55, 62)
    assert r.clips == [] and {c.dimension for c in r.decays} == {
        "emotion.anger", "emotion.joy", "emotion.fear", "emotion.sadness", "emotion.surprise"
    }
    # Goal progress is not an affect: it never drifts back to 50 by itself.
    assert r.state.goals[0].progress == 20
    # Decay never overshoots 50.
    assert constrain(71, None, evidence_ok=False, stimulus=False) == (61, "decay")
    assert constrain(29, None, evidence_ok=False, stimulus=False) == (39, "decay")


def test_a_dimension_the_update_leaves_alone_decays_too() -> None:
    prev = _state(anger=90, joy=40)
    r = apply_update(prev, _update(("emotion.joy", 45, "")), RECENT)
    assert r.state.emotions.anger == 80 and r.state.emotions.joy == 45


def test_restating_an_extreme_without_a_quote_does_not_stop_the_decay() -> None:
    r = apply_update(_state(anger=90), _update(("emotion.anger", 90, "")), RECENT)
    assert r.state.emotions.anger == 80
    r = apply_update(_state(anger=90), _update(("emotion.anger", 90, "my washer broke again")),
                     RECENT)
    assert r.state.emotions.anger == 90


def test_changes_proposed_without_stimulus_are_ignored_and_counted() -> None:
    r = apply_update(_state(joy=50), _update(("emotion.joy", 60, ""), stimulus=False), RECENT)
    assert r.state.emotions.joy == 50
    assert [c.reason for c in r.clips] == ["no_stimulus"]


def test_a_crafted_sequence_never_moves_more_than_20_and_counts_clips_per_turn() -> None:
    state = _state(anger=50)
    proposals = [(95, "my washer broke again"), (10, ""), (12, "for free today"), (60, "nope")]
    history = [state.emotions.anger]
    clips_per_turn = []
    for value, evidence in proposals:
        r = apply_update(state, _update(("emotion.anger", value, evidence)), RECENT)
        state = r.state
        history.append(state.emotions.anger)
        clips_per_turn.append(len(r.clips))
    assert history == [50, 70, 60, 40, 50]
    assert all(abs(b - a) <= 20 for a, b in pairwise(history))
    assert clips_per_turn == [1, 1, 1, 1]


def test_every_dimension_obeys_the_cap() -> None:
    prev = AgentState(goals=[Goal(description="g", progress=0)])
    update = _update(*[(d, 100, "my washer broke again") for d in DIMENSIONS[:6]])
    r = apply_update(prev, update, RECENT)
    for d in DIMENSIONS:
        assert abs(r.state.value(d) - prev.value(d)) <= 20


def test_a_missing_update_keeps_the_previous_state() -> None:
    prev = _state(anger=90)
    r = apply_update(prev, None, RECENT)
    assert r.fallback and r.state == prev and r.clips == []
    assert json.loads(r.log())["fallback"] is True


def test_out_of_range_model_values_are_clamped_not_rejected() -> None:
    u = StateUpdate.model_validate_json(
        '{"stimulus": true, "changes": [{"dimension": "emotion.joy", "value": 130, '
        '"evidence": "x"}], "strategy": "' + "s" * 500 + '"}'
    )
    assert u.changes[0].value == 100 and len(u.strategy) == 140


def test_evidence_must_be_a_real_quote() -> None:
    assert evidence_in('"we will replace it"', RECENT)
    assert not evidence_in("we will refund it", RECENT)
    assert not evidence_in("I", RECENT)


@pytest.mark.parametrize(("emotion", "intensity", "dim", "value"), [
    ("angry", "severe", "anger", 86), ("anxious", "mild", "fear", 62), ("sad", None, "sadness", 74),
])
def test_initial_client_state_comes_from_the_persona(
    emotion: str, intensity: str | None, dim: str, value: int
) -> None:
    s = initial_client_state(make_persona(emotion=emotion, intensity=intensity, concern="my pension",
                                      motivation="wants a clear answer"))
    assert getattr(s.emotions, dim) == value
    assert s.goals[0].description == "Resolve: my pension" and s.goals[0].priority == 90


def test_the_prompt_gets_a_few_salient_items_never_the_whole_state() -> None:
    s = initial_client_state(make_persona(emotion="angry", intensity="severe", concern="refund",
                                      motivation="wants a refund"))
    for n in (3, 4, 5):
        items = salient_items(s, n)
        assert len(items) <= n
        assert items[0].startswith("Main goal") and items[-1].startswith("Your current strategy")
    assert "anger" in " ".join(salient_items(s, 4))
