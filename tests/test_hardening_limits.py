"""Hostile conditions: limits that limit, secrets that stay secret,
bad input that is a clear exit 2 (or a quarantined call) instead of a traceback.

Real code paths: the openai SDK over HTTP to the loopback test server, the CLI's ``main``, Parquet
read back. No wall-clock thresholds: a deadline is checked by the outcome it produces (a trickled
answer would succeed, much later, without it).
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import anyio
import openai
import pandas as pd
import pytest

from spasm.backends.base import ChatRequest
from spasm.backends.keys import resolve_api_key
from spasm.backends.registry import make_backend
from spasm.calls import Caller, CallScope
from spasm.cli import main
from spasm.config import BackendConfig
from spasm.engine import Engine
from spasm.errors import MissingKeyError, RateLimitedError, TimeoutBackendError
from spasm.redact import redact_url
from spasm.testing import FaultPlan, TestServer
from spasm.testing.usage import Usage
from tests.conftest import config_from, endpoint_config

HI = ChatRequest(messages=({"role": "user", "content": "hi"},), temperature=0.0, max_tokens=8)


def _calls(plan: FaultPlan, n: int = 1, **backend: Any) -> tuple[list[Any], list[Any]]:
    """``n`` calls through the Caller to the test server: their results (a Completion or the
    error) and the call-log rows."""
    budget = backend.pop("rate_limit_budget_s", None)

    async def go() -> tuple[list[Any], list[Any]]:
        with TestServer(plan) as srv:
            cfg = BackendConfig(kind="openai", base_url=srv.base_url, model="m", **backend)
            b = make_backend("srv", cfg)
            extra = {} if budget is None else {"rate_limit_budget_s": budget}
            caller = Caller({"srv": b}, {"srv": cfg}, sleep_scale=0.0, **extra)
            scope = CallScope(dialogue_id="d")
            results: list[Any] = []
            try:
                for _ in range(n):
                    try:
                        results.append(await caller.complete("client", "srv", HI, scope))
                    except Exception as exc:
                        results.append(exc)
            finally:
                await b.aclose()
            return results, scope.records

    return anyio.run(go)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _write_config(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "c.json"
    path.write_text(json.dumps(data))
    return path


# --------------------------------------------------------------------------- 4. limits


def test_the_trickle_fault_sends_a_whole_valid_answer() -> None:
    with TestServer(FaultPlan(rate_trickle=1.0, trickle_s=0.0)) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="t", max_retries=0)
        reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert reply.choices[0].message.content and srv.stats["trickle"] == 1


def test_the_timeout_is_a_deadline_for_the_whole_call_not_for_each_read() -> None:
    # One byte every 0.2 s: every read is quick, the answer (~400 bytes) would take ~80 s.
    results, records = _calls(FaultPlan(rate_trickle=1.0, trickle_s=0.2), timeout_s=1.0,
                              max_attempts=1)
    assert isinstance(results[0], TimeoutBackendError)
    assert [r.outcome for r in records] == ["timeout"]


def test_rate_limits_are_waited_out_and_spend_no_attempt() -> None:
    # Half the requests are 429s (no Retry-After) and a call has ONE attempt: a 429 that spent
    # it would fail half the calls.
    results, records = _calls(FaultPlan(rate_429=0.5, retry_after_s=None, seed=5), n=40,
                              max_attempts=1)
    assert all(not isinstance(r, BaseException) for r in results), results
    limited = [r for r in records if r.outcome == "rate_limited"]
    assert len(limited) > 5 and {r.attempt for r in records} == {1}
    assert sum(r.outcome == "ok" for r in records) == 40


def test_past_the_per_call_budget_rate_limits_spend_attempts_and_the_call_fails() -> None:
    results, records = _calls(FaultPlan(rate_429=1.0), max_attempts=2, rate_limit_budget_s=0.0)
    assert isinstance(results[0], RateLimitedError)
    assert [(r.outcome, r.attempt) for r in records] == [("rate_limited", 1), ("rate_limited", 2)]
    results, records = _calls(FaultPlan(rate_429=1.0, retry_after_s=1.0), max_attempts=2,
                              rate_limit_budget_s=5.0)
    assert isinstance(results[0], RateLimitedError)
    assert len(records) > 2  # about five seconds waited out (Retry-After 1 s), then 2 attempts


# The pacing after 429s (spasm.limits.AdaptiveRate): tests/test_limits.py.


def test_a_storm_of_429s_500s_and_malformed_bodies_quarantines_no_dialogue(tmp_path: Path) -> None:
    plan = FaultPlan(rate_429=0.5, retry_after_s=None, rate_500=0.02, rate_malformed=0.02, seed=11)
    with TestServer(plan) as srv:
        data = endpoint_config(srv.base_url, personas={"n": 6}, conditions=["ecp", "concat"],
                               backends={"srv": {"kind": "openai", "base_url": srv.base_url,
                                                 "model": "m", "max_concurrency": 8}})
        summary = anyio.run(Engine(config_from(data), tmp_path / "run", progress=False,
                                   sleep_scale=0.0).run)
        stats = srv.stats
    assert summary.errors == 0 and summary.completed == summary.planned == 12, summary.line()
    calls = pd.read_parquet(tmp_path / "run" / "calls.parquet")
    assert (calls.outcome == "rate_limited").sum() > 20 and stats["429"] > 20
    assert not (tmp_path / "run" / "errors.parquet").exists() or pd.read_parquet(
        tmp_path / "run" / "errors.parquet").empty


def test_a_ray_address_where_nothing_listens_is_exit_2_at_once(
    tmp_path: Path, capsys: Any
) -> None:
    pytest.importorskip("ray")
    port = _free_port()
    cfg = _write_config(tmp_path, endpoint_config("http://127.0.0.1:9/v1"))
    run = tmp_path / "run"
    code = main(["generate", "--config", str(cfg), "--out", str(run), "--no-progress",
                 "--executor", "ray", "--ray-address", f"127.0.0.1:{port}"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"no Ray cluster answers at 127.0.0.1:{port}" in err and "Traceback" not in err
    assert not run.exists()
    assert main(["generate", "--config", str(cfg), "--out", str(run), "--no-progress",
                 "--executor", "ray", "--ray-address", "nonsense"]) == 2
    assert "is not a cluster address" in capsys.readouterr().err


# --------------------------------------------------------------------------- 5. secrets


@pytest.mark.parametrize(("value", "why"), [
    ("sk-SECRETVALUE\nX-Injected: 1", "line break"),
    ("sk-SECRET\tVALUE", "control character"),
    ("sk-SECRETVALUÉ", "non-ASCII"),
])
def test_a_key_that_cannot_be_a_header_is_refused_naming_the_variable_never_the_value(
    server: Any, tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch, value: str, why: str,
) -> None:
    monkeypatch.setenv("SPASM_TEST_KEY", value)
    with pytest.raises(MissingKeyError, match=why) as caught:
        resolve_api_key("SPASM_TEST_KEY", "b")
    assert "SECRET" not in str(caught.value)
    code = main(["generate", "--base-url", server.base_url, "--model", "m", "--api-key-env",
                 "SPASM_TEST_KEY", "--out", str(tmp_path / "run"), "--personas", "1", "--no-progress"])
    captured = capsys.readouterr()
    assert code == 2
    assert "SPASM_TEST_KEY" in captured.err and why in captured.err
    assert "SECRET" not in captured.err + captured.out and "Traceback" not in captured.err
    assert "server" not in captured.err.lower()  # not blamed on the endpoint
    assert not (tmp_path / "run").exists()


def test_redact_url_removes_credentials_and_keeps_the_rest() -> None:
    assert redact_url("http://user:pass@host:8000/v1") == "http://***@host:8000/v1"
    assert redact_url("https://tok@h/v1?api_key=abc&x=1") == "https://***@h/v1?api_key=***&x=1"
    assert redact_url("http://u:p@ss@h/v1") == "http://***@h/v1"  # an unescaped @ in a password
    assert redact_url("connect to http://a:b@h failed; mail x@y.z") == (
        "connect to http://***@h failed; mail x@y.z")
    assert redact_url("http://127.0.0.1:8000/v1") == "http://127.0.0.1:8000/v1"


def test_a_password_in_base_url_is_never_stored_or_printed(
    server: Any, tmp_path: Path, capsys: Any
) -> None:
    secret = "hunter2secret"
    url = server.base_url.replace("http://", f"http://alice:{secret}@")
    run = tmp_path / "run"
    assert main(["generate", "--base-url", url, "--model", "m", "--out", str(run),
                 "--personas", "1", "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert secret not in captured.out + captured.err
    config = json.loads((run / "config.json").read_text())
    assert config["config"]["backends"]["endpoint"]["base_url"].startswith("http://***@127.0.0.1:")
    for path in run.rglob("*"):  # nothing written anywhere holds it
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path
    # A rerun resumes: the stored config matches the one given (credentials aside).
    assert main(["generate", "--base-url", url, "--model", "m", "--out", str(run),
                 "--personas", "1", "--no-progress"]) == 0
    # The stored backend cannot be used as is, and says so.
    assert main(["eval", str(run), "--mode", "probe", "--no-progress"]) == 2
    assert "credentials in its base_url, which are never stored" in capsys.readouterr().err
    # Nor is it printed when the endpoint cannot be reached.
    dead = f"http://alice:{secret}@127.0.0.1:{_free_port()}/v1"
    assert main(["generate", "--base-url", dead, "--model", "m", "--out", str(tmp_path / "r2"),
                 "--personas", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "cannot connect" in err and "http://***@127.0.0.1:" in err and secret not in err


# --------------------------------------------------------------------------- 7. tracebacks


def test_huge_seeds_and_no_pairings_are_exit_2_and_leave_nothing(
    server: Any, tmp_path: Path, capsys: Any
) -> None:
    run = tmp_path / "run"
    base = ["generate", "--base-url", server.base_url, "--model", "m", "--out", str(run),
            "--personas", "1", "--no-progress"]
    assert main([*base, "--seed", "999999999999999999999999"]) == 2
    assert "--seed (seed): Input should be less than or equal to 9223372036854775807" in (
        capsys.readouterr().err)
    yaml_cfg = tmp_path / "c.yaml"
    yaml_cfg.write_text(f"seed: {2**64}\n")
    assert main(["generate", "--config", str(yaml_cfg), "--out", str(run), "--dry-run"]) == 2
    assert "seed: Input should be less than or equal to" in capsys.readouterr().err
    out = tmp_path / "p.parquet"
    assert main(["personas", "--n", "2", "--seed", str(10**24), "--out", str(out)]) == 2
    assert "--seed must be between" in capsys.readouterr().err
    assert not out.exists() and not out.with_name("p.rejected.parquet").exists()
    cfg = _write_config(tmp_path, endpoint_config(server.base_url, pairings=[]))
    assert main(["generate", "--config", str(cfg), "--out", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "pairings is empty" in err and "Traceback" not in err
    assert not run.exists()


class _BadUsage(Usage):
    def __init__(self, prompt_tokens: int) -> None:
        super().__init__()
        self.reported = prompt_tokens

    def prompt_tokens(self, messages: Any) -> int:
        return self.reported


@pytest.mark.parametrize("reported", [10**30, -840])
def test_an_absurd_usage_figure_is_a_malformed_answer_and_never_counted(
    tmp_path: Path, reported: int
) -> None:
    with TestServer(usage=_BadUsage(reported)) as srv:
        data = endpoint_config(srv.base_url, personas={"n": 1},
                               backends={"srv": {"kind": "openai", "base_url": srv.base_url,
                                                 "model": "m", "max_attempts": 2}})
        summary = anyio.run(Engine(config_from(data), tmp_path / "run", progress=False,
                                   sleep_scale=0.0).run)
    assert summary.completed == 0 and summary.errors == 1
    assert "-840" not in summary.line()
    calls = pd.read_parquet(tmp_path / "run" / "calls.parquet")
    assert set(calls.outcome) == {"malformed"} and (calls.prompt_tokens == 0).all()
    assert calls.error.str.contains("usage.prompt_tokens").all()
    errors = pd.read_parquet(tmp_path / "run" / "errors.parquet")
    assert set(errors.error_type) == {"MalformedResponseError"}


@pytest.mark.parametrize(("change", "message"), [
    ({"conversation_id": 10**20}, "conversation_id 100000000000000000000 is out of range"),
    ({"conversation_id": "99999999999999999999"}, "is out of range"),
    ({"persona_fields": {"age": 10**30}}, "persona field 'age'"),
    ({"seed": 2**64}, "seed 18446744073709551616 is out of range"),
])
def test_import_of_numbers_no_column_holds_is_exit_2_and_leaves_nothing(
    tmp_path: Path, capsys: Any, change: dict[str, Any], message: str
) -> None:
    record = {"persona_id": "P1", "conversation_id": 0, "persona_fields": {"age": 42},
              "turns": [{"speaker": "client", "text": "hi"}, {"speaker": "tested", "text": "hello"}],
              **change}
    src = tmp_path / "release.jsonl"
    src.write_text(json.dumps(record) + "\n")
    out = tmp_path / "imported"
    assert main(["import", str(src), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and "release.jsonl:1" in err and "Traceback" not in err
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["release.jsonl"]


def test_import_of_a_number_with_thousands_of_digits_is_exit_2(tmp_path: Path, capsys: Any) -> None:
    src = tmp_path / "release.jsonl"
    src.write_text('{"persona_id": "P1", "conversation_id": ' + "9" * 5000 + ', "turns": []}\n')
    assert main(["import", str(src), "--out", str(tmp_path / "imported")]) == 2
    err = capsys.readouterr().err
    assert "release.jsonl:1 cannot be read" in err and "Traceback" not in err
    assert not (tmp_path / "imported").exists()


def _small_run(run: Path) -> Path:
    with TestServer() as srv:
        data = endpoint_config(srv.base_url, personas={"n": 2})
        summary = anyio.run(Engine(config_from(data), run, progress=False, sleep_scale=0.0).run)
    assert summary.completed == 2
    return run


def test_eval_with_an_openai_embedder_at_a_non_json_server_is_exit_2(
    tmp_path: Path, capsys: Any
) -> None:
    run = _small_run(tmp_path / "run")
    before = sorted(p.name for p in run.iterdir())
    with TestServer(FaultPlan(rate_malformed=1.0, malformed_body="html")) as srv:
        code = main(["eval", str(run), "--embedder", "openai", "--embedding-base-url",
                     srv.base_url, "--embedding-api-key-env", "none", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "does not answer like an OpenAI-compatible embeddings API" in err
    assert "Traceback" not in err
    assert sorted(p.name for p in run.iterdir()) == before  # no eval/ left behind


@pytest.mark.e2e
def test_the_viewer_reads_old_labels_and_a_foreign_metrics_json_without_a_500(tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    from spasm.viewer.server import ViewerServer
    from tests.test_viewer_http import get

    run = _small_run(tmp_path / "run")
    ids = sorted(pd.read_parquet(run / "dialogues.parquet").dialogue_id)
    # The format used before the viewer: one file, a boolean echoing, no annotator or time.
    pd.DataFrame({"dialogue_id": [ids[0], ids[0], ids[1]], "echoing": [True, False, True]}).to_parquet(
        run / "annotations.parquet")
    (run / "eval").mkdir()
    (run / "eval" / "metrics.json").write_text(json.dumps({
        "echoing": {"method": ["not", "text"], "rates": [
            {"pairing": "endpoint/endpoint", "condition": "ecp", "n": 2, "n_echoing": 1, "rate": 0.5,
             "ci_low": 0.1, "ci_high": 0.9, "by_client": 1, "by_responder": 0},
            "a string, not a row"]},
        "drift": [1, 2, 3],
        "separability": {"not": "a list"},
    }))
    with ViewerServer(run) as srv:
        status, page, _ = get(srv.base_url + "/")
        d_status, dialogue, _ = get(f"{srv.base_url}/d/{ids[0]}")
    assert status == 200 and d_status == 200
    assert "Not all of eval/metrics.json could be read" in page
    assert "1 of 2 entries of echoing.rates" in page and "drift is not an object" in page
    assert "separability is not a list" in page
    assert ">0.50<" in page  # the valid row is shown
    assert "rater1" in dialogue and "rater2" in dialogue and ">yes<" in dialogue
    (run / "eval" / "metrics.json").write_text("[1, 2]")
    with ViewerServer(run) as srv:
        status, page, _ = get(srv.base_url + "/")
    assert status == 200 and "it is a JSON list, not an object" in page
