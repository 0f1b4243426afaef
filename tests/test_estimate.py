"""``--dry-run`` estimates by construction: the planned dialogues run through the same code
against scripted, token-counting backends."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pandas as pd
import pytest
import yaml

from spasm import projection
from spasm.backends.base import ChatRequest, Message
from spasm.backends.scripted import ScriptedBackend, filler
from spasm.config import BackendConfig, data_path, parse_config
from spasm.engine import Engine
from spasm.estimate import DryRun, format_estimates
from spasm.history import History
from spasm.projection import Viewer
from spasm.registry import PROJECTIONS
from spasm.testing import TestServer
from spasm.tokens import count_messages, count_tokens
from tests.conftest import endpoint_config

TOY = "toy-briefed"
BRIEFING = "Keep the house rules of this service desk in mind before you say anything. " * 25


def _dry(config: Any, run: Path, pilot: int = 0) -> DryRun:
    engine = Engine(config, run, progress=False, sleep_scale=0.0)
    return anyio.run(lambda: engine.dry_run(pilot))


def _run(config: Any, run: Path) -> None:
    anyio.run(Engine(config, run, progress=False, sleep_scale=0.0).run)


def _spent(run: Path) -> pd.DataFrame:
    """Call rows that reached a backend (a cache hit spends nothing), with the dialogue's
    condition and harness level."""
    calls = pd.read_parquet(run / "calls.parquet")
    calls = calls[~calls.cache_hit]
    dialogues = pd.read_parquet(run / "dialogues.parquet")[
        ["dialogue_id", "condition", "harness_level"]
    ]
    merged = calls.merge(dialogues, on="dialogue_id", how="left")
    merged["total"] = merged.prompt_tokens + merged.completion_tokens
    return merged


def _ablation_on(base_url: str, review: str = "separate") -> Any:
    data = yaml.safe_load(data_path("configs", "harness-ablation.yaml").read_text())
    data["backends"] = {"embedded": {"kind": "openai", "base_url": base_url, "model": "m"}}
    data["harness"]["review"] = review
    # No response cache: C and D (and D and E) can send identical requests, and which of two
    # dialogues in flight together reaches the server first — the other replays it from the
    # cache and spends nothing — is a matter of timing; the estimate prices every call.
    data["engine"] = {"cache": False}
    return parse_config(data, "harness-ablation.yaml on the test server")


@pytest.mark.parametrize("review", ["separate", "merged"])
def test_dry_run_is_within_25_percent_of_the_real_run_at_every_level(tmp_path: Path, review: str) -> None:
    """configs/harness-ablation.yaml (levels A–E) pointed at the test server: a dry run with a
    pilot of 1 dialogue (the first planned one, level A) against the tokens the real run then
    spends, level by level, from calls.parquet. The pilot gives reply size and the servers'
    token-count ratios; levels B–E are priced only by simulating their harness calls."""
    run = tmp_path / "run"
    with TestServer() as srv:
        config = _ablation_on(srv.base_url, review)
        dry = _dry(config, run, pilot=1)
        assert dry.calibration is not None and dry.calibration.dialogues == 1
        _run(config, run)
    spent = _spent(run)
    assert len(spent) and spent.harness_level.notna().all()
    real = spent.groupby("harness_level").total.sum()
    # Calls are counted with cache hits: which of two identical requests from dialogues in
    # flight together reaches the server first (and which replays it) is a matter of timing.
    every = pd.read_parquet(run / "calls.parquet").merge(
        pd.read_parquet(run / "dialogues.parquet")[["dialogue_id", "harness_level"]], on="dialogue_id")
    real_calls = every.groupby("harness_level").size()
    estimated = {e.key[1]: e for e in dry.levels}
    assert sorted(estimated) == sorted(real.index) == ["A", "B", "C", "D", "E"]
    for level, e in estimated.items():
        error = abs(e.total_tokens - real[level]) / real[level]
        assert error <= 0.25, (level, e.total_tokens, int(real[level]))
        # Every reducer, checker, rewrite, audit and probe call is in the estimate.
        assert e.calls == real_calls[level], level
    assert real["E"] > 2 * real["A"]  # a formula counting one call per utterance misses this


@pytest.fixture
def toy_projection(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A projection spasm does not ship: ECP with a long briefing before the history."""

    def briefed(history: History, viewer: Viewer) -> list[Message]:
        messages = projection.ecp(history, viewer)
        return [messages[0], {"role": "user", "content": BRIEFING}, *messages[1:]]

    projection.register_projection(TOY)(briefed)
    yield TOY
    PROJECTIONS.unregister(TOY)


def test_a_registered_projection_is_estimated_with_its_own_messages(
    tmp_path: Path, toy_projection: str
) -> None:
    run = tmp_path / "run"
    with TestServer() as srv:
        data = endpoint_config(srv.base_url, personas={"n": 2}, conditions=["ecp", toy_projection],
                               termination={"rules": False})
        config = parse_config(data, "<test>")
        dry = _dry(config, run, pilot=1)  # calibrated on the first dialogue, an ECP one
        _run(config, run)
    real = _spent(run).groupby("condition").total.sum()
    estimated = {e.key[0]: e.total_tokens for e in dry.levels}
    assert real[toy_projection] > 2 * real["ecp"]  # the briefing dominates: ECP's price is wrong
    for condition in ("ecp", toy_projection):
        error = abs(estimated[condition] - real[condition]) / real[condition]
        assert error <= 0.25, (condition, estimated[condition], int(real[condition]))


def _llm_config(base_url: str) -> Any:
    data = endpoint_config(
        base_url, personas={"n": 2, "llm_validate": True, "llm_craft": True},
        termination={"rules": False, "judge": True, "min_utterances": 4},
        harness={"client": "C", "responder": "C"},
    )
    return parse_config(data, "<test>")


def test_an_uncalibrated_dry_run_sends_nothing_writes_nothing_and_prices_persona_calls(
    tmp_path: Path,
) -> None:
    with TestServer() as srv:
        config = _llm_config(srv.base_url)
        dry = _dry(config, tmp_path / "dry")
        assert srv.requests == []
        assert list(tmp_path.iterdir()) == []
        _run(config, tmp_path / "run")
    assert dry.calibration is None
    spent = _spent(tmp_path / "run")
    persona_phase = spent[spent.dialogue_id.isna()]
    assert set(persona_phase.role) == {"validator", "crafter", "policy"}
    assert dry.personas.calls == len(persona_phase)
    assert dry.roles["judge"] > 0 and dry.roles["reducer"] > 0
    # An upper bound: every dialogue to the cap (the test server's judge ends them at 4).
    assert dry.total.total_tokens > spent.total.sum()
    text = format_estimates(dry)
    assert "upper bound" in text and "personas" in text and "judge" in text


def test_a_pilot_prices_judge_validator_crafter_and_policy_calls_one_for_one(
    tmp_path: Path,
) -> None:
    """A pilot of 1 dialogue: it ends where the test server's judge says (4 utterances), so
    the simulated dialogues make exactly the calls of the real ones, role by role."""
    run = tmp_path / "run"
    with TestServer() as srv:
        config = _llm_config(srv.base_url)
        dry = _dry(config, run, pilot=1)
        _run(config, run)
    spent = _spent(run)
    assert dry.roles == spent.role.value_counts().to_dict()
    assert abs(dry.total.total_tokens - spent.total.sum()) / spent.total.sum() <= 0.25


def test_a_large_plan_is_sampled_per_group_and_scaled_up(tmp_path: Path) -> None:
    with TestServer() as srv:
        data = endpoint_config(srv.base_url, personas={"n": 20}, conditions=["ecp", "concat"],
                               harness={"levels": ["A", "B"]})
        dry = _dry(parse_config(data, "<test>"), tmp_path / "run")
        assert srv.requests == []
    assert dry.planned == 80 and dry.simulated == 16  # 4 per (pairing, condition, level)
    assert sorted(e.dialogues for e in dry.levels) == [20, 20, 20, 20]
    assert sum(e.calls for e in dry.levels) == pytest.approx(dry.total.calls)
    text = format_estimates(dry)
    assert "16 of 80 planned dialogues simulated" in text
    assert "concat, level B" in text


def test_scripted_backend_counts_prompts_fills_to_length_and_answers_schemas() -> None:
    backend = ScriptedBackend("srv", BackendConfig(kind="openai", base_url="http://x", model="m"),
                              reply_tokens=12.0, overrides={"finished": False})
    messages: tuple[Message, ...] = ({"role": "system", "content": "You are a tutor."},
                                     {"role": "user", "content": "Hello there."})
    free = anyio.run(backend.complete, ChatRequest(messages, 0.7, max_tokens=40, seed=1))
    assert free.prompt_tokens == count_messages(messages)
    assert free.completion_tokens == count_tokens(free.text) == 12
    again = anyio.run(backend.complete, ChatRequest(messages, 0.7, max_tokens=40, seed=1))
    assert again.text == free.text  # deterministic
    schema = {"type": "object", "properties": {"finished": {"type": "boolean"},
                                               "reason": {"type": "string"}},
              "required": ["finished", "reason"]}
    structured = anyio.run(backend.complete, ChatRequest(messages, 0.3, 100, json_schema=schema))
    assert structured.text == '{"finished": false, "reason": "ok"}'
    assert structured.completion_tokens == count_tokens(structured.text)
    capped = ScriptedBackend("srv", BackendConfig(kind="openai", base_url="http://x", model="m"))
    long = anyio.run(capped.complete, ChatRequest(messages, 0.7, max_tokens=40, seed=1))
    assert long.completion_tokens == 40  # uncalibrated: max_tokens, an upper bound
    assert filler(5, 1) != filler(5, 2)
