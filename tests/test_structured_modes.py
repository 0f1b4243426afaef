"""Structured-output modes, fail-fast on rejected formats, errors by type, the key lookup and the
backend registry — through the real openai SDK against the loopback test server."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import pandas as pd
import pytest
import yaml
from pydantic import BaseModel

from spasm.backends import ChatRequest, make_backend, register_backend, resolve_api_key
from spasm.backends.base import Backend, Completion
from spasm.backends.openai_compat import OpenAIBackend
from spasm.backends.structured import extract_json, instruction
from spasm.calls import Cache, Caller, CallScope
from spasm.cli import main
from spasm.config import BackendConfig, parse_config
from spasm.engine import Engine, RunSummary
from spasm.errors import (
    BackendError,
    ConfigError,
    ConnectionBackendError,
    FatalBackendError,
    MalformedResponseError,
    MissingKeyError,
    StructuredOutputRejectedError,
    TimeoutBackendError,
    TransientBackendError,
    UserError,
)
from spasm.testing import FaultPlan, TestServer
from spasm.testing.server import default_reply, instance_from_schema
from tests.conftest import config_from, endpoint_config

SCHEMA_INTRO = "It must follow this JSON schema:\n"


def small_config(base_url: str, mode: str = "auto", **overrides: Any) -> dict[str, Any]:
    """One persona, LLM-validated; one short level-E dialogue with the termination judge."""
    settings: dict[str, Any] = {
        "personas": {"n": 1, "llm_validate": True},
        "dialogue": {"max_turns_per_agent": 2, "max_tokens": 24},
        "termination": {"rules": False, "judge": True, "min_utterances": 2},
        "harness": {"client": "E", "responder": "E"},
    }
    data = endpoint_config(base_url, **{**settings, **overrides})
    data["backends"]["srv"]["structured_output"] = mode
    return data


def text_capable(body: dict[str, Any]) -> str:
    """The test server's default reply, plus: a request whose schema is only in its prompt gets
    an instance of it: bare for a bare json_object (as DeepSeek answers), else wrapped in prose
    and a Markdown fence (as a chat model in text mode may)."""
    fmt = body.get("response_format") or {}
    last = body["messages"][-1]["content"]
    if "schema" not in fmt and "json_schema" not in fmt and SCHEMA_INTRO in last:
        schema, _ = json.JSONDecoder().raw_decode(last.split(SCHEMA_INTRO, 1)[1])
        instance = json.dumps(instance_from_schema(schema))
        if fmt.get("type") == "json_object":
            return instance
        return f"Sure! Here it is:\n```json\n{instance}\n```\nAnything else?"
    return default_reply(body)


def run_engine(data: dict[str, Any], run: Path) -> RunSummary:
    return anyio.run(Engine(config_from(data), run, progress=False, sleep_scale=0.0).run)


def manifest(run: Path) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((run / "manifest.json").read_text())
    return result


def structured(bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The requests that carried a schema (in response_format or in the prompt)."""
    return [
        b for b in bodies
        if b.get("response_format") or SCHEMA_INTRO in str(b["messages"][-1]["content"])
    ]


# -- each mode ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["json_schema", "json_object", "text"])
def test_each_mode_sends_its_format_and_every_structured_call_parses(mode: str, tmp_path: Path) -> None:
    with TestServer(reply=text_capable) as srv:
        summary = run_engine(small_config(srv.base_url, mode), tmp_path / "run")
        bodies = structured(srv.requests)
    assert summary.completed == summary.planned == 1 and summary.failed is None, summary.line()
    assert summary.harness_fallbacks == 0 and bodies
    for body in bodies:
        fmt: dict[str, Any] = body.get("response_format") or {}
        prompt = body["messages"][-1]["content"]
        if mode == "json_schema":
            assert fmt["type"] == "json_schema" and "schema" in fmt["json_schema"]
            assert SCHEMA_INTRO not in prompt
        elif mode == "json_object":
            # The schema both in the request (llama.cpp takes it) and in the prompt, with "json".
            assert fmt["type"] == "json_object" and fmt["schema"]["type"] == "object"
            assert SCHEMA_INTRO in prompt and "json" in prompt
        else:
            assert not fmt and SCHEMA_INTRO in prompt and "For example:" in prompt
    calls = pd.read_parquet(tmp_path / "run" / "calls.parquet")
    assert set(calls.outcome) == {"ok"}
    m = manifest(tmp_path / "run")
    assert m["status"] == "complete"
    assert m["structured_output"]["srv"] == {"configured": mode, "mode": mode, "rejected": []}
    assert m["counts"]["harness_fallbacks_this_pass"] == 0


def test_a_run_that_failed_on_its_mode_resumes_with_another_mode(tmp_path: Path) -> None:
    """The mode is a transport detail, outside the run fingerprint: fix it and rerun."""
    assert config_from(small_config("http://127.0.0.1:9/v1")).fingerprint() == config_from(
        small_config("http://127.0.0.1:9/v1", "text")).fingerprint()
    with TestServer(reply=text_capable, reject_formats={"json_schema"}) as srv:
        with pytest.raises(StructuredOutputRejectedError):
            run_engine(small_config(srv.base_url, "json_schema"), tmp_path / "run")
        summary = run_engine(small_config(srv.base_url, "json_object"), tmp_path / "run")
    assert summary.completed == summary.planned == 1 and summary.failed is None, summary.line()
    assert manifest(tmp_path / "run")["status"] == "complete"


# -- auto: step down on a rejection -----------------------------------------------------------


@pytest.mark.parametrize(
    ("rejected", "chosen", "steps"),
    [
        ({"json_schema"}, "json_object", ["json_schema"]),
        ({"json_schema", "schema_field"}, "json_object (no schema field)", ["json_schema", "json_object"]),
        ({"json_schema", "json_object"}, "text",
         ["json_schema", "json_object", "json_object (no schema field)"]),
    ],
)
def test_auto_steps_down_once_and_then_sends_only_what_the_server_takes(
    rejected: set[str], chosen: str, steps: list[str], tmp_path: Path
) -> None:
    with TestServer(reply=text_capable, reject_formats=rejected) as srv:
        summary = run_engine(small_config(srv.base_url), tmp_path / "run")
        bodies = srv.requests
        stats = srv.stats
    assert summary.completed == summary.planned == 1 and summary.failed is None, summary.line()
    assert summary.harness_fallbacks == 0
    # Each rejected rung was tried exactly once (it names response_format: no repeat, no probe).
    assert stats["500"] == len(steps)
    m = manifest(tmp_path / "run")["structured_output"]["srv"]
    assert m["mode"] == chosen and [s["mode"] for s in m["rejected"]] == steps
    assert all(s["status"] == 500 and "response_format" in s["message"] for s in m["rejected"])
    # After the step-down every structured request is sent in the chosen mode.
    after = structured(bodies)[len(steps):]
    assert after and all(
        (b.get("response_format") or {}).get("type", "text") == chosen.split(" ")[0] for b in after
    )
    # The step-down is inside one logical call: the calls table has no rejected attempt.
    calls = pd.read_parquet(tmp_path / "run" / "calls.parquet")
    assert set(calls.outcome) == {"ok"}


def test_a_bare_500_is_a_rejection_only_if_it_repeats_while_plain_requests_work(tmp_path: Path) -> None:
    def reply(body: dict[str, Any]) -> str:
        if (body.get("response_format") or {}).get("type") == "json_schema":
            raise RuntimeError("boom")  # the server answers 500 without naming the format
        return text_capable(body)

    with TestServer(reply=reply) as srv:
        summary = run_engine(small_config(srv.base_url), tmp_path / "run")
    assert summary.failed is None and summary.harness_fallbacks == 0, summary.line()
    m = manifest(tmp_path / "run")["structured_output"]["srv"]
    assert m["mode"] == "json_object" and m["rejected"][0]["mode"] == "json_schema"


def test_one_injected_500_on_the_first_structured_call_does_not_change_the_mode() -> None:
    async def go() -> tuple[str | None, Completion]:
        with TestServer() as srv:
            cfg = BackendConfig(kind="openai", base_url=srv.base_url, model="m")
            backend = OpenAIBackend("srv", cfg)
            srv.set_plan(FaultPlan(rate_500=1.0))
            request = ChatRequest(messages=({"role": "user", "content": "hi"},), temperature=0.0,
                                  max_tokens=16, json_schema={"type": "object", "properties": {}})
            with pytest.raises(TransientBackendError):
                await backend.complete(request)  # 500, 500 again, and the plain probe fails too
            srv.set_plan(FaultPlan())
            try:
                completion = await backend.complete(request)
                return backend.structured_mode, completion
            finally:
                await backend.aclose()

    mode, completion = anyio.run(go)
    assert mode == "json_schema" and json.loads(completion.text) == {}


class _Snapshots(list[Any]):
    """A call log that keeps each row as it was when written, to show no row is edited later."""

    def __init__(self) -> None:
        super().__init__()
        self.as_written: list[dict[str, Any]] = []

    def append(self, row: Any) -> None:
        self.as_written.append(row.model_dump())
        super().append(row)


class _Answer(BaseModel):
    answer: int


def test_each_call_row_is_written_once_with_its_final_outcome(tmp_path: Path) -> None:
    """A structured call whose first reply does not validate is asked again; its rows (the
    invalid reply's, then the valid one's, and the same two replayed from the cache) are
    written once each with their final outcome, and the caller's counts agree with them."""
    def reply(body: dict[str, Any]) -> str:  # a number only once told what is wrong
        asked_again = "did not validate" in body["messages"][-1]["content"]
        return '{"answer": 42}' if asked_again else '{"answer": "many"}'

    async def go(base_url: str, cache: Cache) -> tuple[Any, _Snapshots, Counter[str]]:
        cfg = BackendConfig(kind="openai", base_url=base_url, model="m")
        backend = make_backend("srv", cfg)
        caller = Caller({"srv": backend}, {"srv": cfg}, cache=cache, sleep_scale=0.0)
        scope = CallScope(dialogue_id="d")
        scope.records = _Snapshots()
        try:
            result = await caller.structured("eval_probe", "srv", [{"role": "user", "content": "n?"}],
                                             _Answer, scope, temperature=0.0)
        finally:
            await backend.aclose()
        return result, scope.records, caller.usage.outcomes

    cache = Cache(tmp_path / "cache.sqlite")
    with TestServer(reply=reply) as srv:  # one server: the cache key names its URL
        for expected in (["invalid_output", "ok"], ["invalid_output", "cache_hit"]):
            result, rows, outcomes = anyio.run(go, srv.base_url, cache)
            assert result.value == _Answer(answer=42) and result.attempts == 2
            assert [r.outcome for r in rows] == expected
            assert [r.model_dump() for r in rows] == rows.as_written  # never edited after the write
            assert "answer" in (rows[0].error or "") and rows[1].error is None
            assert [r.cache_hit for r in rows] == [expected[1] == "cache_hit"] * 2
            assert outcomes == Counter(expected)  # the summary's counts are the table's
        assert len(srv.requests) == 2  # the second time, both replies came from the cache
    cache.close()


# -- fail fast ------------------------------------------------------------------------------


def test_a_pinned_mode_the_server_rejects_fails_fast_with_the_servers_message(tmp_path: Path) -> None:
    with TestServer(reject_formats={"json_schema"}) as srv:
        with pytest.raises(StructuredOutputRejectedError) as info:
            run_engine(small_config(srv.base_url, "json_schema"), tmp_path / "run")
        stats = srv.stats
    message = str(info.value)
    assert "'srv'" in message and "'json_schema'" in message and "500" in message
    assert "Input should be 'text' or 'json_object'" in message
    assert "structured_output" in message  # says what to change
    assert stats["500"] == 1  # no retries, no fallback: the first rejection ends the run
    assert manifest(tmp_path / "run")["status"] == "failed"


def test_a_rejection_inside_the_dialogues_ends_the_run_and_is_logged(tmp_path: Path) -> None:
    data = small_config("", "json_schema", personas={"n": 3, "llm_validate": False})
    with TestServer(reject_formats={"json_schema"}) as srv:
        data["backends"]["srv"]["base_url"] = srv.base_url
        with pytest.raises(StructuredOutputRejectedError, match="json_schema"):
            run_engine(data, tmp_path / "run")
        rejected = [b for b in srv.requests if b.get("response_format")]
    # Concurrent dialogues may each have sent one; no dialogue sent a second.
    assert 1 <= len(rejected) <= 3
    m = manifest(tmp_path / "run")
    assert m["status"] == "failed" and "rejects structured output" in m["failed"]
    assert m["usage"]["call_outcomes"].get("format_rejected", 0) >= 1


def test_the_cli_exits_1_naming_backend_mode_and_server_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with TestServer(reject_formats={"json_schema"}) as srv:
        config = tmp_path / "run.yaml"
        config.write_text(yaml.safe_dump(small_config(srv.base_url, "json_schema")))
        code = main(["generate", "--config", str(config), "--out", str(tmp_path / "run"),
                     "--no-progress"])
    err = capsys.readouterr().err
    assert code == 1
    assert "run failed:" in err and "'srv'" in err and "'json_schema'" in err and "500" in err


def test_a_level_whose_structured_calls_all_fell_back_fails_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def reply(body: dict[str, Any]) -> str:
        if body.get("response_format"):
            return "Sure! Here is the JSON you asked for: {not json at all"
        return "Hello, I still need help with my washing machine."

    data = small_config("", personas={"n": 1, "llm_validate": False},
                        termination={"rules": False, "judge": False})
    with TestServer(reply=reply) as srv:
        data["backends"]["srv"]["base_url"] = srv.base_url
        config = tmp_path / "run.yaml"
        config.write_text(yaml.safe_dump(data))
        code = main(["generate", "--config", str(config), "--out", str(tmp_path / "run"),
                     "--no-progress"])
    err = capsys.readouterr().err
    assert code == 1 and "every structured harness call fell back at harness level E" in err
    m = manifest(tmp_path / "run")
    turns = pd.read_parquet(tmp_path / "run" / "turns.parquet")
    assert m["status"] == "failed" and "level E" in m["failed"]
    assert m["counts"]["harness_fallbacks_this_pass"] == int(turns.harness_fallbacks.sum()) > 0
    assert m["counts"]["harness_fallbacks_by_level"] == {"E": int(turns.harness_fallbacks.sum())}


def test_some_fallbacks_among_parsed_replies_are_counted_but_do_not_fail(tmp_path: Path) -> None:
    seen = {"checker": 0}

    def reply(body: dict[str, Any]) -> str:
        fmt = body.get("response_format") or {}
        title = ((fmt.get("json_schema") or {}).get("schema") or {}).get("title")
        if title == "CheckerOutput":
            seen["checker"] += 1
            if seen["checker"] == 1:
                return "no JSON here"  # the first checker call falls back after its re-asks
        return default_reply(body)

    data = small_config("", termination={"rules": False, "judge": False})
    data["engine"] = {"reask_attempts": 0}
    with TestServer(reply=reply) as srv:
        data["backends"]["srv"]["base_url"] = srv.base_url
        summary = run_engine(data, tmp_path / "run")
    assert summary.failed is None and summary.harness_fallbacks == 1, summary.line()
    assert "1 harness fallbacks" in summary.line()
    assert manifest(tmp_path / "run")["status"] == "complete"


# -- errors by type -------------------------------------------------------------------------


def one_call(plan: FaultPlan, model: str = "m") -> tuple[BaseException | None, list[Any]]:
    async def go() -> tuple[BaseException | None, list[Any]]:
        with TestServer(plan) as srv:
            cfg = BackendConfig(kind="openai", base_url=srv.base_url, model=model,
                                max_attempts=2, timeout_s=0.5)
            backend = make_backend("srv", cfg)
            caller = Caller({"srv": backend}, {"srv": cfg}, sleep_scale=0.0)
            scope = CallScope(dialogue_id="d")
            request = ChatRequest(messages=({"role": "user", "content": "hi"},), temperature=0.0,
                                  max_tokens=8)
            try:
                await caller.complete("client", "srv", request, scope)
            except BackendError as exc:
                return exc, scope.records
            finally:
                await backend.aclose()
            return None, scope.records

    return anyio.run(go)


@pytest.mark.parametrize(
    ("plan", "error", "outcome"),
    [
        (FaultPlan(rate_500=1.0), TransientBackendError, "server_error"),
        # 429s spend no attempt: tests/test_hardening_limits.py
        (FaultPlan(rate_drop=1.0), ConnectionBackendError, "connection_error"),
        (FaultPlan(rate_hang=1.0, hang_s=5.0), TimeoutBackendError, "timeout"),
        (FaultPlan(rate_malformed=1.0), MalformedResponseError, "malformed"),
        (FaultPlan(rate_malformed=1.0, malformed_body="html"), MalformedResponseError, "malformed"),
        (FaultPlan(rate_malformed=1.0, malformed_body="no_choices"), MalformedResponseError,
         "malformed"),
    ],
)
def test_transient_failures_are_classified_by_type_retried_and_logged(
    plan: FaultPlan, error: type[BackendError], outcome: str
) -> None:
    exc, records = one_call(plan)
    assert type(exc) is error and isinstance(exc, TransientBackendError)
    assert [r.outcome for r in records] == [outcome, outcome]  # both attempts, each logged
    assert all(r.error for r in records)


def test_a_bad_request_is_fatal_and_not_retried() -> None:
    exc, records = one_call(FaultPlan(), model="")  # the server answers 400: no model
    assert isinstance(exc, FatalBackendError) and exc.status == 400
    assert [r.outcome for r in records] == ["fatal"]


def test_an_html_body_in_a_run_is_retried_and_logged_and_the_run_completes(tmp_path: Path) -> None:
    data = endpoint_config("", personas={"n": 2}, dialogue={"max_turns_per_agent": 2, "max_tokens": 20})
    data["backends"]["srv"]["max_attempts"] = 12
    with TestServer(FaultPlan(rate_malformed=0.3, malformed_body="html", seed=2)) as srv:
        data["backends"]["srv"]["base_url"] = srv.base_url
        summary = run_engine(data, tmp_path / "run")
    assert summary.completed == summary.planned == 2 and summary.errors == 0
    calls = pd.read_parquet(tmp_path / "run" / "calls.parquet")
    bad = calls[calls.outcome == "malformed"]
    assert len(bad) > 0 and bad.error.str.contains("not JSON").all()
    assert bad.error.str.contains("Bad Gateway").all()


# -- one key lookup ---------------------------------------------------------------------------


def test_the_key_lookup_says_what_is_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPASM_TEST_KEY", raising=False)
    assert resolve_api_key(None, "b") == "not-needed"
    with pytest.raises(MissingKeyError, match="SPASM_TEST_KEY, which is not set"):
        resolve_api_key("SPASM_TEST_KEY", "b")
    monkeypatch.setenv("SPASM_TEST_KEY", "")
    with pytest.raises(MissingKeyError, match="SPASM_TEST_KEY, which is empty"):
        resolve_api_key("SPASM_TEST_KEY", "b")
    monkeypatch.setenv("SPASM_TEST_KEY", "  \n")
    with pytest.raises(MissingKeyError, match="holds only whitespace"):
        resolve_api_key("SPASM_TEST_KEY", "b")
    monkeypatch.setenv("SPASM_TEST_KEY", "sk-abc\n")
    assert resolve_api_key("SPASM_TEST_KEY", "b") == "sk-abc"
    # The backend reads it through the same function.
    monkeypatch.setenv("SPASM_TEST_KEY", " ")
    cfg = BackendConfig(kind="openai", base_url="http://127.0.0.1:9/v1", api_key_env="SPASM_TEST_KEY")
    with pytest.raises(MissingKeyError, match="'b' needs an API key"):
        make_backend("b", cfg)


class _Unauthorized(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b'{"error": {"message": "no key", "type": "auth"}}'
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def unauthorized() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Unauthorized)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_rejected_request_without_a_key_variable_does_not_say_none(unauthorized: str) -> None:
    async def go() -> None:
        backend = make_backend("b", BackendConfig(kind="openai", base_url=unauthorized, model="m"))
        try:
            await backend.preflight()
        finally:
            await backend.aclose()

    with pytest.raises(UserError) as info:
        anyio.run(go)
    assert "$None" not in str(info.value) and "api_key_env" in str(info.value)


# -- registry ---------------------------------------------------------------------------------


def test_backends_are_registered_by_kind_and_an_unknown_kind_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown backend kind 'nope'"):
        parse_config({"backends": {"x": {"kind": "nope"}},
                      "pairings": [{"client": "x", "responder": "x"}]})
    cfg = BackendConfig.model_construct(kind="nope")
    with pytest.raises(ConfigError, match="'nope'"):
        make_backend("x", cfg)

    @register_backend("fake-for-test")
    class Fake(Backend):
        def __init__(self, name: str, cfg: BackendConfig) -> None:
            self.name, self.model = name, cfg.model

        async def complete(self, request: ChatRequest) -> Completion:
            return Completion("ok", 1, 1, "fake")

    try:
        built = make_backend("f", BackendConfig(kind="fake-for-test"))
        assert isinstance(built, Fake) and built.name == "f"
        assert isinstance(make_backend("o", BackendConfig(base_url="http://127.0.0.1:9/v1")),
                          OpenAIBackend)
    finally:
        from spasm.registry import BACKENDS

        BACKENDS.unregister("fake-for-test")


# -- reading JSON out of a reply ----------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        '{"valid": true, "reason": "ok"}',
        '```json\n{"valid": true, "reason": "ok"}\n```',
        'Sure! Here it is:\n```\n{"valid": true, "reason": "ok"}\n```\nAnything else?',
        'My verdict {in braces} is {"valid": true, "reason": "ok"} — hope that helps {:',
        '{"valid": true, "reason": "line one\nline two"}'.replace("line two", "ok"),
    ],
)
def test_extract_json_finds_the_object_in_fences_and_prose(text: str) -> None:
    value = extract_json(text)
    assert value["valid"] is True and value["reason"].endswith("ok")


def test_extract_json_raises_with_a_position_when_there_is_none() -> None:
    with pytest.raises(json.JSONDecodeError) as info:
        extract_json("Sure! Here is the JSON you asked for: {not json at all")
    assert info.value.pos > 0
    with pytest.raises(json.JSONDecodeError):
        extract_json("no braces at all")


def test_the_prompt_instruction_has_the_word_json_the_schema_and_an_example() -> None:
    schema = {"type": "object", "properties": {"valid": {"type": "boolean"},
                                               "n": {"type": "integer", "minimum": 3}}}
    note = instruction(schema)
    assert "json" in note and json.dumps(schema) in note
    assert '{"valid": true, "n": 3}' in note
