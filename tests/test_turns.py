"""The turn is the seam: what a turn records is what the agent returned, not what the call log
happens to hold.

Runs go through the real engine and openai SDK against the loopback test server.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pandas as pd

from spasm.engine import Engine
from spasm.testing import FaultPlan, TestServer
from spasm.testing.server import default_reply
from tests.conftest import config_from, endpoint_config

#: One dialogue (one persona, one condition), so requests arrive in a fixed order and the
#: seeded fault plan hits the same calls on every run.
FAULTS = FaultPlan(rate_500=0.3, seed=3)
CHECK_PASS = {"dimension_scores": {"boundary": 95, "fact": 90, "state": 90, "style": 90},
              "violations": [], "correction_advice": ""}
CHECK_FAIL = {"dimension_scores": {"boundary": 20, "fact": 60, "state": 60, "style": 60},
              "violations": ["offers help like the agent"], "correction_advice": "Just ask."}


def _run(config: dict[str, Any], run: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    summary = anyio.run(Engine(config_from(config), run, progress=False, sleep_scale=0.0).run)
    assert summary.completed == summary.planned == 1, summary.line()
    turns = pd.read_parquet(run / "turns.parquet").sort_values("turn_index")
    return turns, pd.read_parquet(run / "calls.parquet")


def _config(base_url: str, **harness: Any) -> dict[str, Any]:
    return endpoint_config(
        base_url, personas={"n": 1}, dialogue={"max_turns_per_agent": 3, "max_tokens": 40},
        termination={"rules": False}, harness=harness,
    )


def _checker_fails_drafts(body: dict[str, Any]) -> str:
    """Checker verdicts fail a draft and pass its rewrite; other structured calls get a valid
    default; generation writes a draft, or a rewrite when the prompt carries one."""
    fmt = body.get("response_format") or {}
    title = ((fmt.get("json_schema") or {}).get("schema") or {}).get("title")
    if title == "CheckerOutput":
        candidate = body["messages"][-1]["content"]
        return json.dumps(CHECK_PASS if "REWRITE" in candidate else CHECK_FAIL)
    if title is not None:
        return default_reply(body)
    last_system = next(
        (m["content"] for m in reversed(body["messages"]) if m["role"] == "system"), ""
    )
    if "Your draft was:" in last_system:
        return "REWRITE: I just want my order fixed."
    return "DRAFT: Fine, whatever works for you."


def _retried(calls: pd.DataFrame, roles: set[str]) -> int:
    """Failed transport attempts of calls in ``roles`` (each was retried and then succeeded)."""
    return int((calls.role.isin(roles) & (calls.outcome == "server_error")).sum())


def test_transport_retries_are_not_attempts(tmp_path: Path) -> None:
    with TestServer(FAULTS) as srv:
        turns, calls = _run(_config(srv.base_url), tmp_path / "run")
    assert _retried(calls, {"client", "responder"}) > 0  # some generation call was retried
    assert len(turns) == 6 and (turns.attempts == 1).all()


def test_a_rewrite_is_the_second_attempt_whatever_the_retries(tmp_path: Path) -> None:
    with TestServer(FAULTS, reply=_checker_fails_drafts) as srv:
        turns, calls = _run(_config(srv.base_url, client="E"), tmp_path / "run")
    assert _retried(calls, {"client", "rewrite"}) > 0
    client = turns[turns.speaker == "client"]
    responder = turns[turns.speaker == "responder"]
    assert (client.attempts == 2).all() and client.text.str.startswith("REWRITE").all()
    assert all(json.loads(v)["rewritten"] for v in client.checker_verdict)
    assert (responder.attempts == 1).all()


def test_audits_and_probes_measure_the_agent_without_changing_it(tmp_path: Path) -> None:
    with TestServer() as srv:
        plain, _ = _run(_config(srv.base_url, client="C", responder="B"), tmp_path / "plain")
        measured, calls = _run(
            _config(srv.base_url, client="C", responder="B", audit=True, recall_probe=True),
            tmp_path / "measured",
        )
    same = ["speaker", "text", "messages_sha256", "messages", "intent", "attempts"]
    pd.testing.assert_frame_equal(plain[same].reset_index(drop=True),
                                  measured[same].reset_index(drop=True))
    assert plain.checker_verdict.isna().all() and plain.probe.isna().all()
    verdicts = [json.loads(v) for v in measured.checker_verdict]
    assert len(verdicts) == 6 and all(v["mode"] == "audit" for v in verdicts)
    assert (calls.role == "audit").sum() == 6 and (calls.role == "probe").sum() == 2
    last = measured.groupby("speaker").tail(1)
    assert last.probe.notna().all() and measured.probe.notna().sum() == 2
