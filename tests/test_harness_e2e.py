"""The harness end to end through the real openai SDK against the loopback test server."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import anyio
import pandas as pd
import pytest

from spasm.dataset import open_run
from spasm.engine import Engine
from spasm.harness.cli import register
from spasm.harness.level_report import level_report
from spasm.projection import messages_digest
from spasm.testing import TestServer
from tests.conftest import config_from, endpoint_config

pytestmark = pytest.mark.e2e


def _run(config: dict[str, Any], run: Path) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    summary = anyio.run(Engine(config_from(config), run, progress=False, sleep_scale=0.0).run)
    assert summary.completed == summary.planned, summary.line()
    return (
        pd.read_parquet(run / "dialogues.parquet"),
        pd.read_parquet(run / "turns.parquet").sort_values(["dialogue_id", "turn_index"]),
        pd.read_parquet(run / "calls.parquet"),
    )


def _no_errors(run: Path) -> bool:
    path = run / "errors.parquet"
    return not path.exists() or pd.read_parquet(path).empty


def _title(body: dict[str, Any]) -> str | None:
    fmt = body.get("response_format") or {}
    schema = (fmt.get("json_schema") or {}).get("schema") or {}
    return schema.get("title")


def _last_system(body: dict[str, Any]) -> str:
    return next((m["content"] for m in reversed(body["messages"]) if m["role"] == "system"), "")


CHECK_PASS = {"dimension_scores": {"boundary": 95, "fact": 90, "state": 90, "style": 90},
              "violations": [], "correction_advice": ""}


def _check_fail(advice: str) -> dict[str, Any]:
    return {"dimension_scores": {"boundary": 20, "fact": 60, "state": 60, "style": 60},
            "violations": ["offers help like the agent"], "correction_advice": advice}


def _scripted(checker: Any, draft: str = "Fine, whatever works for you.") -> Any:
    """Replies: the checker decides by ``checker(body)``; other structured calls get a valid
    default; drafts and rewrites are marked so the checker can tell them apart."""
    from spasm.testing.server import default_reply

    counter = {"n": 0}

    def reply(body: dict[str, Any]) -> str:
        title = _title(body)
        if title == "CheckerOutput":
            return json.dumps(checker(body))
        if title is not None:
            return default_reply(body)
        counter["n"] += 1
        if "Your draft was:" in _last_system(body):
            return f"REWRITE {counter['n']}: I just want my order fixed."
        return f"DRAFT {counter['n']}: {draft}"

    return reply


def _harness_config(base_url: str, **harness: Any) -> dict[str, Any]:
    return endpoint_config(
        base_url, personas={"n": 1}, dialogue={"max_turns_per_agent": 3, "max_tokens": 40},
        termination={"rules": False}, harness={"client": "E", "responder": "A", **harness},
    )


def test_a_failed_check_triggers_exactly_one_rewrite_carrying_the_advice(tmp_path: Path) -> None:
    def checker(body: dict[str, Any]) -> dict[str, Any]:
        candidate = body["messages"][-1]["content"]
        return CHECK_PASS if "REWRITE" in candidate else _check_fail("ADVICE: ask, never advise.")

    with TestServer(reply=_scripted(checker)) as srv:
        _, turns, calls = _run(_harness_config(srv.base_url), tmp_path / "run")
        rewrites = [b for b in srv.requests if "Your draft was:" in _last_system(b)]
    client = turns[turns.speaker == "client"]
    assert len(client) == 3 and len(rewrites) == 3  # one rewrite per client turn, no more
    for body in rewrites:
        note = _last_system(body)
        assert "ADVICE: ask, never advise." in note and "DRAFT" in note
    assert (client.attempts == 2).all() and not client.flagged.any()
    assert client.text.str.startswith("REWRITE").all()
    for raw in client.checker_verdict:
        v = json.loads(raw)
        assert v["pass"] is True and v["rewritten"] is True and len(v["checks"]) == 2
        assert v["checks"][0]["pass"] is False and v["checks"][1]["pass"] is True
        # The pass decision and overall score are computed in code with 40/25/20/15 weights.
        assert v["checks"][0]["overall_score"] == pytest.approx(0.4 * 20 + 0.6 * 60)
    # The Responder at level A is untouched.
    responder = turns[turns.speaker == "responder"]
    assert responder.checker_verdict.isna().all() and (responder.attempts == 1).all()
    roles = calls.role.value_counts()
    assert roles["checker"] == 6 and roles["rewrite"] == 3 and roles["client"] == 3
    assert roles["reducer"] == 2 and roles["policy"] == 1  # the first turn has nothing to reduce


def test_two_failures_are_accepted_and_flagged(tmp_path: Path) -> None:
    with TestServer(reply=_scripted(lambda body: _check_fail("Stop offering help."))) as srv:
        _, turns, calls = _run(_harness_config(srv.base_url), tmp_path / "run")
    client = turns[turns.speaker == "client"]
    assert client.flagged.all() and (client.flag_reason == "failed_twice").all()
    assert (client.attempts == 2).all() and client.text.str.startswith("REWRITE").all()
    verdicts = [json.loads(v) for v in client.checker_verdict]
    assert all(v["pass"] is False and len(v["checks"]) == 2 for v in verdicts)
    assert all(v["checks"][0]["source"] == "model" for v in verdicts)
    assert (calls.role == "rewrite").sum() == 3 and (calls.role == "checker").sum() == 6
    # The next turn carries the last correction.
    later = [json.loads(m)[-1]["content"] for m in client.messages.iloc[1:]]
    assert all("Last correction: Stop offering help." in m for m in later)


def test_a_breach_the_code_screen_finds_fails_without_a_checker_call(tmp_path: Path) -> None:
    reply = _scripted(lambda body: CHECK_PASS, draft="As an AI, I can help you with that.")
    with TestServer(reply=reply) as srv:
        _, turns, calls = _run(_harness_config(srv.base_url), tmp_path / "run")
        rewrites = [_last_system(b) for b in srv.requests if "Your draft was:" in _last_system(b)]
    client = turns[turns.speaker == "client"]
    verdicts = [json.loads(v) for v in client.checker_verdict]
    assert all(v["checks"][0]["source"] == "code" and v["pass"] for v in verdicts)
    assert "says or implies it is an AI" in verdicts[0]["checks"][0]["violations"]
    assert len(rewrites) == 3 and all("says or implies it is an AI" in r for r in rewrites)
    # Only the rewrites were sent to the checker model.
    assert (calls.role == "checker").sum() == 3 and not client.flagged.any()


def test_garbage_structured_output_never_crashes_a_dialogue(tmp_path: Path) -> None:
    def reply(body: dict[str, Any]) -> str:
        if _title(body) is not None:
            return "Sure! Here is the JSON you asked for: {not json at all"
        return "Hello, I still need help with my washing machine."

    data = _harness_config("", client="E", responder="E", context="llm", window=2, stride=1)
    data["dialogue"]["max_turns_per_agent"] = 4
    with TestServer(reply=reply) as srv:
        data["backends"]["srv"]["base_url"] = srv.base_url
        dialogues, turns, calls = _run(data, tmp_path / "run")
    assert (dialogues.status == "ok").all() and _no_errors(tmp_path / "run")
    assert len(turns) == 8
    # Unchecked replies are accepted with a flag; every fallback is counted.
    assert turns.flagged.all() and (turns.flag_reason == "checker_unavailable").all()
    assert (turns.harness_fallbacks >= 1).all()
    assert int(turns.harness_fallbacks.sum()) >= 8 + 6 + 2  # checks, reducer steps, policies
    # The state never moved: each agent's stored state is its initial one, turn after turn.
    for _, g in turns.groupby("speaker"):
        assert g.state.nunique() == 1
    logs = [json.loads(x) for x in turns.state_log.dropna()]
    assert logs and all(log["fallback"] for log in logs)
    assert (calls.outcome == "invalid_output").sum() > 0
    report = level_report(tmp_path / "run")
    assert report["levels"]["E"]["harness_fallbacks"] == int(turns.harness_fallbacks.sum())


def test_backend_errors_on_harness_calls_fall_back_too(tmp_path: Path) -> None:
    def reply(body: dict[str, Any]) -> str:
        if _title(body) is not None:
            raise RuntimeError("harness calls are down")  # the server answers 500
        return "Hello, I still need help with my washing machine."

    data = _harness_config("")
    data["backends"]["srv"]["max_attempts"] = 2
    with TestServer(reply=reply) as srv:
        data["backends"]["srv"]["base_url"] = srv.base_url
        dialogues, turns, _ = _run(data, tmp_path / "run")
    assert (dialogues.status == "ok").all()
    client = turns[turns.speaker == "client"]
    assert client.flagged.all() and (client.harness_fallbacks >= 1).all()


def test_the_ablation_sweeps_all_levels_on_the_same_personas_and_seeds(
    server: Any, tmp_path: Path
) -> None:
    sweep = endpoint_config(
        server.base_url, personas={"n": 2}, conditions=["ecp", "concat"],
        dialogue={"max_turns_per_agent": 5, "max_tokens": 40}, termination={"rules": False},
        harness={"levels": ["A", "B", "C", "D", "E"], "window": 3, "stride": 2},
    )
    dialogues, turns, calls = _run(sweep, tmp_path / "sweep")
    assert len(dialogues) == 2 * 2 * 5
    assert set(dialogues.harness_level) == {"A", "B", "C", "D", "E"}
    assert all(d.endswith(f"-{lvl}") for d, lvl in zip(dialogues.dialogue_id,
                                                       dialogues.harness_level, strict=True))
    for _, g in dialogues.groupby(["persona_id", "condition"]):
        assert len(g) == 5 and g.seed.nunique() == 1
    level = dialogues.set_index("dialogue_id").harness_level
    turns = turns.assign(level=turns.dialogue_id.map(level))
    assert turns[turns.level.isin(["A", "B"])].state.isna().all()
    assert turns[turns.level.isin(["C", "D", "E"])].state.notna().all()
    assert turns[turns.level == "A"].messages.isna().all()
    assert turns[turns.level != "A"].messages.notna().all()
    # What each agent saw is recoverable byte for byte at every level.
    sent = {messages_digest(b["messages"]) for b in server.requests if "messages" in b}
    opened = open_run(tmp_path / "sweep")
    for did in dialogues.dialogue_id:
        view = opened.dialogue(did)
        for i, t in enumerate(view.turns):
            assert view.seen(i).verified is True
            if t["attempts"] == 1:
                assert t["messages_sha256"] in sent
    # Level A of the sweep is today's generation, request for request.
    plain = endpoint_config(server.base_url, personas={"n": 2}, conditions=["ecp", "concat"],
                            dialogue={"max_turns_per_agent": 5, "max_tokens": 40},
                            termination={"rules": False})
    _, plain_turns, _ = _run(plain, tmp_path / "plain")
    a = turns[turns.level == "A"].assign(dialogue_id=lambda x: x.dialogue_id.str[:-2])
    cols = ["dialogue_id", "turn_index", "text", "messages_sha256"]
    pd.testing.assert_frame_equal(a[cols].reset_index(drop=True),
                                  plain_turns[cols].reset_index(drop=True))
    # The harness calls are in the call log under their roles.
    assert {"policy", "reducer", "checker", "rewrite"} <= set(calls.role)


def test_the_responder_never_gets_the_card_and_the_client_is_never_told_it_is_an_ai(
    server: Any, tmp_path: Path
) -> None:
    data = endpoint_config(server.base_url, personas={"n": 1},
                           dialogue={"max_turns_per_agent": 4, "max_tokens": 40},
                           termination={"rules": False},
                           harness={"levels": ["E"], "window": 2, "stride": 1, "audit": True,
                                    "recall_probe": True})
    _run(data, tmp_path / "run")
    personas = pd.read_parquet(tmp_path / "run" / "personas.parquet")
    persona = personas.iloc[0]
    secrets = [persona.card, persona.concern, f"Your name is {persona.first_name}"]
    responder_side = ("You are a customer-service agent", "inner state of the customer-service",
                      "written by a customer-service agent")
    n_responder = 0
    for body in server.requests:
        blob = json.dumps(body["messages"], ensure_ascii=False)
        first = body["messages"][0]["content"]
        if first.startswith(responder_side) or any(s in first for s in responder_side):
            n_responder += 1
            for secret in secrets:
                assert secret not in blob
        elif persona.card in blob or f"Your name is {persona.first_name}" in blob:
            # A Client-side request: no frame that tells it it is an AI.
            assert " AI" not in first and "language model" not in first
    assert n_responder > 0


def test_the_report_has_every_level_and_the_token_ratios(server: Any, tmp_path: Path) -> None:
    data = endpoint_config(
        server.base_url, personas={"n": 2}, dialogue={"max_turns_per_agent": 4, "max_tokens": 30},
        termination={"rules": False},
        harness={"levels": ["A", "B", "C", "D", "E"], "window": 2, "stride": 2, "audit": True,
                 "recall_probe": True},
    )
    _run(data, tmp_path / "run")
    report = level_report(tmp_path / "run")
    assert set(report["levels"]) == {"A", "B", "C", "D", "E"}
    a, e = report["levels"]["A"], report["levels"]["E"]
    assert a["checked_turns"] == 16 and a["boundary_violation_rate"] is not None  # audits
    assert a["state_turns"] == 0 and e["state_turns"] == 16
    assert e["calls_per_turn"] > a["calls_per_turn"]
    assert a["recall_responder"] is not None and e["recall_out_of_window_share"] == 1.0
    # The test server reports no cached tokens: the cost falls back to spasm's estimate.
    assert report["cost_source"] == "estimate"
    assert e["metrics"]["cache_adjusted_tokens_per_dialogue"]["value"] < e["tokens_per_dialogue"]
    assert set(report["token_ratio_vs_A"]) == {"B", "C", "D", "E"}
    assert report["token_ratio_vs_A"]["E"]["pairs"] == 2
    # The by-length curve ends at the whole dialogue, where it equals the paired ratio.
    curve = report["token_ratio_by_length"]["E"]
    assert curve["8"] == report["token_ratio_vs_A"]["E"]["ratio_of_sums"]
    assert (tmp_path / "run" / "harness_report.md").read_text().startswith("# Persona Harness")
    # The CLI sub-command the main parser can register.
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["harness-report", str(tmp_path / "run"), "--cache-discount", "0.9"])
    assert args.func(args) == 0
    assert json.loads((tmp_path / "run" / "harness_report.json").read_text())["cache_discount"] == 0.9
