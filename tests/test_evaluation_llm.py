"""The probe and the judge go through the engine's caller: the run's backend, cache and call log."""

from __future__ import annotations

import argparse
import json
import socket
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from spasm.cli import main
from spasm.config import BackendConfig
from spasm.dataset.lock import RunLock
from spasm.dataset.synthetic import write_run
from spasm.errors import StructuredOutputRejectedError, UserError
from spasm.evaluation import evaluate
from spasm.evaluation.cli import register
from spasm.testing import TestServer
from spasm.testing.server import default_reply
from tests.conftest import endpoint_config


def _eval(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="spasm")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["eval", *argv, "--no-progress"])
    code: int = args.func(args)
    return code


def structured_reply(body: dict[str, Any]) -> str:
    """Valid probe and judge answers (told apart by their prompts); the default reply otherwise."""
    system = str(body["messages"][0]["content"])
    if "stance" in system:
        last = str(body["messages"][1]["content"]).rsplit("Client: ", 1)[-1][:40]
        return json.dumps({"concerns": f"worried: {last}", "emotion": "tense", "motivation": "a fix"})
    if "ECHOING" in system:
        return json.dumps({"echoing": False, "who": "none", "evidence": []})
    return default_reply(body)


def _generate(tmp_path: Path, base_url: str, **overrides: Any) -> Path:
    cfg = tmp_path / "config.yaml"
    data = endpoint_config(base_url, personas={"n": 2}, dialogue={"max_turns_per_agent": 2}, **overrides)
    cfg.write_text(yaml.safe_dump(data))
    run = tmp_path / "run"
    assert main(["generate", "--config", str(cfg), "--out", str(run), "--no-progress"]) == 0
    return run


def _calls(run: Path) -> pd.DataFrame:
    return pd.read_parquet(run / "calls.parquet")


@pytest.mark.e2e
def test_probe_and_judge_use_the_runs_backend_are_logged_and_cached(tmp_path: Path) -> None:
    with TestServer(reply=structured_reply) as srv:
        run = _generate(tmp_path, srv.base_url)
        generation_calls = len(_calls(run))
        sent_before = len(srv.requests)
        assert _eval([str(run), "--mode", "probe", "--judge"]) == 0
        chat = srv.requests[sent_before:]
        first = json.loads((run / "eval" / "metrics.json").read_text())

        calls = _calls(run)
        evals = calls[calls.role.isin(["eval_probe", "eval_judge"])]
        dialogues = set(pd.read_parquet(run / "dialogues.parquet").dialogue_id)
        n_client_turns = first["counts"]["client_turns"]
        assert len(calls) == generation_calls + len(evals)  # appended, nothing lost
        assert (evals.role == "eval_probe").sum() == n_client_turns
        assert (evals.role == "eval_judge").sum() == len(dialogues)
        assert set(evals.dialogue_id) == dialogues and set(evals.backend) == {"srv"}
        assert set(evals.outcome) == {"ok"} and not evals.cache_hit.any()
        assert evals.call_id.is_unique
        # Structured output on the wire, at the backend's judge temperature.
        assert len(chat) == len(evals)
        assert all(b["response_format"]["type"] == "json_schema" for b in chat)
        assert {b["temperature"] for b in chat} == {0.3} and {b["model"] for b in chat} == {"m"}

        usage = first["llm"]
        assert usage["backend"] == "srv" and usage["source"].startswith("run config")
        assert usage["calls"] == len(evals) and usage["cache_hits"] == 0
        assert usage["calls_by_role"] == {"eval_judge": len(dialogues), "eval_probe": n_client_turns}
        assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
        assert first["drift"]["probe_fallbacks"] == 0 and first["echoing"]["judge_fallbacks"] == 0

        # A rerun is answered by the run's cache: no request at all, and logged as cache hits.
        before = srv.stats["requests"]
        assert _eval([str(run), "--mode", "probe", "--judge"]) == 0
        assert srv.stats["requests"] == before
    second = json.loads((run / "eval" / "metrics.json").read_text())
    calls = _calls(run)
    all_evals = calls[calls.role.isin(["eval_probe", "eval_judge"])]
    rerun = all_evals[all_evals.cache_hit]
    assert len(all_evals) == 2 * len(evals) and len(rerun) == len(evals)
    assert set(rerun.outcome) == {"cache_hit"}
    assert set(rerun.request_hash) == set(evals.request_hash)
    assert second["llm"]["cache_hits"] == second["llm"]["calls"] == len(evals)
    assert second["llm"]["prompt_tokens"] == 0 and second["llm"]["cost"] == 0
    assert second["drift"]["curves"] == first["drift"]["curves"]
    assert second["echoing"]["rates"] == first["echoing"]["rates"]


@pytest.mark.e2e
def test_llm_backend_picks_another_backend_of_the_run(tmp_path: Path) -> None:
    with TestServer(reply=structured_reply) as gen, TestServer(reply=structured_reply) as judge:
        backends = {
            "srv": {"kind": "openai", "base_url": gen.base_url, "model": "m"},
            "judge": {"kind": "openai", "base_url": judge.base_url, "model": "judge-m",
                      "temperatures": {"judge": 0.1}},
        }
        run = _generate(tmp_path, gen.base_url, backends=backends)
        before = gen.stats["requests"]
        assert _eval([str(run), "--judge", "--llm-backend", "judge"]) == 0
        assert gen.stats["requests"] == before
        bodies = [b for b in judge.requests if "messages" in b]
    assert {b["model"] for b in bodies} == {"judge-m"} and {b["temperature"] for b in bodies} == {0.1}
    assert set(_calls(run).query("role == 'eval_judge'").backend) == {"judge"}
    with pytest.raises(UserError, match=r"'nope' is not a backend .*judge, srv"):
        _eval([str(run), "--judge", "--llm-backend", "nope"])


@pytest.mark.e2e
def test_endpoint_flags_on_an_imported_run(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", [{"persona_id": "p1", "card": "A customer."}],
                    [{"dialogue_id": "d1", "persona_id": "p1", "texts": ["hi", "hello", "bye"]}])
    with pytest.raises(UserError, match=r"has no config\.json.*--llm-backend embedded"):
        _eval([str(run), "--judge"])
    assert not (run / "cache.sqlite").exists()
    with TestServer(reply=structured_reply) as srv:
        argv = [str(run), "--mode", "probe", "--judge", "--llm-base-url", srv.base_url,
                "--llm-model", "probe-m", "--llm-api-key-env", "none"]
        assert _eval(argv) == 0
    calls = _calls(run)
    assert sorted(calls.role) == ["eval_judge", "eval_probe", "eval_probe"]
    assert set(calls.backend) == {"eval"} and set(calls.model) == {"probe-m"}
    assert (run / "cache.sqlite").exists()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--llm-base-url", "http://127.0.0.1:9/v1"], "--llm-base-url needs --llm-model"),
        (["--llm-backend", "embedded", "--llm-model", "m"], "Use one or the other"),
        (["--llm-model", "m", "--llm-api-key-env", "sk-123"], "NAME of an environment variable"),
        (["--llm-backend", "embedded", "--llm-max-tokens", "0"], "--llm-max-tokens must be at least 1"),
    ],
)
def test_bad_llm_flags_are_user_errors(tmp_path: Path, flags: list[str], message: str) -> None:
    run = write_run(tmp_path / "run", [{"persona_id": "p1"}],
                    [{"dialogue_id": "d1", "persona_id": "p1", "texts": ["hi", "hello"]}])
    with pytest.raises(UserError, match=message):
        _eval([str(run), "--judge", *flags])
    with pytest.raises(UserError, match="add one of those"):
        _eval([str(run), *flags])


def test_missing_key_a_locked_run_and_an_unreachable_endpoint_fail_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = write_run(tmp_path / "run", [{"persona_id": "p1"}],
                    [{"dialogue_id": "d1", "persona_id": "p1", "texts": ["hi", "hello"]}])
    monkeypatch.delenv("SPASM_TEST_NO_SUCH_KEY", raising=False)
    with pytest.raises(UserError, match="SPASM_TEST_NO_SUCH_KEY"):
        _eval([str(run), "--judge", "--llm-model", "m", "--llm-api-key-env", "SPASM_TEST_NO_SUCH_KEY"])
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    with RunLock(run), pytest.raises(UserError, match="is being written by process"):
        _eval([str(run), "--judge", "--llm-base-url", url, "--llm-model", "m", "--llm-api-key-env", "none"])
    # The backend's preflight runs before the first uncached request, not after every retry.
    with pytest.raises(UserError, match="cannot connect"):
        _eval([str(run), "--judge", "--llm-base-url", url, "--llm-model", "m", "--llm-api-key-env", "none"])


@pytest.mark.e2e
@pytest.mark.slow
def test_probe_and_judge_on_the_embedded_model(tmp_path: Path) -> None:
    """One client turn probed and judged in-process (~3 short calls), then replayed from the cache."""
    texts = ["My washing machine broke after a month. Is it covered?", "Yes, it is under warranty."]
    run = write_run(tmp_path / "run", [{"persona_id": "p1", "card": "A customer."}],
                    [{"dialogue_id": "d1", "persona_id": "p1", "texts": texts}])
    argv = [str(run), "--mode", "probe", "--judge", "--llm-backend", "embedded", "--llm-max-tokens", "24"]
    assert _eval(argv) == 0
    evals = _calls(run)
    assert set(evals.role) == {"eval_probe", "eval_judge"} and set(evals.backend) == {"embedded"}
    assert set(evals.dialogue_id) == {"d1"} and not evals.cache_hit.any()
    assert evals.resolved_model.str.contains("gguf").all()
    first = json.loads((run / "eval" / "metrics.json").read_text())
    assert first["llm"]["kind"] == "embedded" and first["llm"]["calls"] == len(evals)
    assert first["llm"]["source"] == "embedded default" and first["llm"]["completion_tokens"] > 0

    assert _eval(argv) == 0  # the rerun replays the cache, re-asks included
    again = _calls(run)
    rerun = again[again.cache_hit]
    assert len(again) == 2 * len(evals) and set(rerun.request_hash) == set(evals.request_hash)
    second = json.loads((run / "eval" / "metrics.json").read_text())
    assert second["llm"]["cache_hits"] == len(evals)
    assert second["drift"]["probe_fallbacks"] == first["drift"]["probe_fallbacks"]
    assert second["echoing"]["judge_fallbacks"] == first["echoing"]["judge_fallbacks"]


def test_a_server_refusing_json_schema_is_adapted_to_or_stops_the_evaluation(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", [{"persona_id": "p1"}],
                    [{"dialogue_id": "d1", "persona_id": "p1", "texts": ["hi", "hello", "bye"]}])
    with TestServer(reply=structured_reply, reject_formats={"json_schema"}) as srv:
        auto = BackendConfig(kind="openai", base_url=srv.base_url, model="m")
        m = evaluate(run, mode="probe", judge=True, llm_config=auto, write=False, progress=False)
        assert m.drift.probe_fallbacks == 0 and m.echoing.judge_fallbacks == 0
        # The probe found the mode the server takes; the judge, on the same backend, keeps it.
        formats = [b["response_format"]["type"] for b in srv.requests if "response_format" in b]
        assert formats == ["json_schema"] + ["json_object"] * 3  # 2 probes and the judge

        pinned = BackendConfig(
            kind="openai", base_url=srv.base_url, model="m2", structured_output="json_schema"
        )
        with pytest.raises(StructuredOutputRejectedError, match="in mode 'json_schema'"):
            evaluate(run, judge=True, llm_config=pinned, write=False, progress=False)
    outcomes = _calls(run).query("model == 'm2'").outcome
    assert list(outcomes) == ["format_rejected"]  # logged, and nothing fell back silently
