"""Your agent under test as a backend (``kind: python``): the function gets exactly the frame
a model would, and a read-only context; it runs under the backend's limits, its failures are
retried and quarantined, its calls are logged, and its replies are cached only when the config
says the function is deterministic. Runs use the test server (real openai SDK over HTTP) as
the other side and read the Parquet tables back."""

from __future__ import annotations

import dataclasses
import re
import sqlite3
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pandas as pd
import pytest
import yaml

from spasm.agents import responder_system_prompt
from spasm.backends.base import CallContext, ChatRequest
from spasm.backends.python import AgentContext, PythonBackend, load_target
from spasm.calls import Cache, Caller, CallScope
from spasm.cli import main
from spasm.config import BackendConfig, parse_config
from spasm.engine import Engine
from spasm.errors import ConfigError, FatalBackendError, TimeoutBackendError
from spasm.seeds import derive_seed
from spasm.testing import TestServer
from tests.conftest import config_from, endpoint_config

ROOT = Path(__file__).resolve().parents[1]

AGENTS = textwrap.dedent('''
    import threading

    import anyio

    CALLS = []
    STATE = {"inside": 0, "peak": 0, "failures": 0, "event": None}

    def responder(messages, context):
        CALLS.append((messages, context, threading.current_thread().name))
        return {"text": f"Reply {context.turn_index}: how can I help?",
                "prompt_tokens": 11, "completion_tokens": 5}

    class Usage:
        def __init__(self, text):
            self.text, self.prompt_tokens, self.completion_tokens = text, 3, 2

    async def client(messages, context):
        CALLS.append((messages, context, threading.current_thread().name))
        return Usage(f"Client line {context.turn_index}, about my parcel.")

    def broken(messages, context):
        raise ValueError("inventory service down")

    def flaky(messages, context):
        STATE["failures"] += 1
        if STATE["failures"] == 1:
            raise ConnectionError("reset by peer")
        return "Recovered."

    def number(messages, context):
        return 42

    def negative(messages, context):
        return {"text": "ok", "prompt_tokens": -1}

    async def slow(messages, context):
        await anyio.sleep_forever()

    async def gated(messages, context):
        # Waits until two calls are inside at once: with max_concurrency 2 that is the peak.
        if STATE["event"] is None:
            STATE["event"] = anyio.Event()
        STATE["inside"] += 1
        STATE["peak"] = max(STATE["peak"], STATE["inside"])
        if STATE["inside"] == 2:
            STATE["event"].set()
        await STATE["event"].wait()
        await anyio.sleep(0)
        STATE["inside"] -= 1
        return "Done."
''')


@pytest.fixture
def agents(tmp_path: Path) -> str:
    """A file of agent functions; returns its path for ``path/to/file.py:function`` targets."""
    path = tmp_path / "agents.py"
    path.write_text(AGENTS)
    return str(path)


def module_of(target: str) -> dict[str, Any]:
    """The globals of a loaded target (where the agent functions record their calls)."""
    return load_target(target).__globals__


def python_backend(target: str, **settings: Any) -> dict[str, Any]:
    return {"kind": "python", "target": target, **settings}


def run(config: dict[str, Any], out: Path) -> Any:
    return anyio.run(Engine(config_from(config), out, progress=False, sleep_scale=0.0).run)


def caller_for(target: str, tmp_path: Path, **settings: Any) -> tuple[Caller, CallScope]:
    cfg = BackendConfig(**python_backend(target, **settings))
    backend = PythonBackend("bot", cfg)
    caller = Caller({"bot": backend}, {"bot": cfg}, cache=Cache(tmp_path / "cache.sqlite"),
                    sleep_scale=0.0)
    return caller, CallScope(dialogue_id="d1")


def request(seed: int = 1) -> ChatRequest:
    return ChatRequest(messages=({"role": "system", "content": "You help."},
                                 {"role": "user", "content": "My parcel is late."}),
                       temperature=0.7, max_tokens=40, seed=seed,
                       context=CallContext("d1", "responder", 1, None))


def test_a_python_responder_gets_the_projected_frame_and_a_read_only_context(
        agents: str, tmp_path: Path) -> None:
    target = f"{agents}:responder"
    with TestServer() as srv:
        data = endpoint_config(srv.base_url, personas={"n": 2})
        data["backends"]["bot"] = python_backend(target)
        data["pairings"] = [{"client": "srv", "responder": "bot"}]
        summary = run(data, tmp_path / "run")
    assert summary.completed == summary.planned == 2, summary.line()
    turns = pd.read_parquet(tmp_path / "run" / "turns.parquet")
    dialogues = pd.read_parquet(tmp_path / "run" / "dialogues.parquet").set_index("dialogue_id")
    calls_made = module_of(target)["CALLS"]
    assert len(calls_made) == (turns.speaker == "responder").sum()
    frame = responder_system_prompt(config_from(data).dialogue.responder_role)
    for messages, context, thread in calls_made:
        did, index = context.dialogue_id, context.turn_index
        earlier = turns[(turns.dialogue_id == did) & (turns.turn_index < index)].sort_values("turn_index")
        # Exactly what a model in the Responder's place is sent under ECP.
        assert messages == [{"role": "system", "content": frame}] + [
            {"role": "user" if s == "client" else "assistant", "content": t}
            for s, t in zip(earlier.speaker, earlier.text, strict=True)]
        assert context.speaker == "responder" and index % 2 == 1
        assert context.seed == derive_seed(int(dialogues.loc[did, "seed"]), index, "responder")
        assert context.scenario_id is None and context.json_schema is None
        assert context.backend == "bot" and context.max_tokens == 40
        assert thread != "MainThread"  # a plain function runs in a worker thread
        with pytest.raises(dataclasses.FrozenInstanceError):
            context.speaker = "client"
    replies = turns[turns.speaker == "responder"]
    assert all(t == f"Reply {i}: how can I help?" for i, t in zip(replies.turn_index, replies.text,
                                                                   strict=True))
    assert set(dialogues.responder_model) == {target}  # its model name is the target
    calls = pd.read_parquet(tmp_path / "run" / "calls.parquet")
    bot = calls[calls.backend == "bot"]
    assert len(bot) == len(replies) and set(bot.outcome) == {"ok"} and set(bot.role) == {"responder"}
    assert set(bot.prompt_tokens) == {11} and set(bot.completion_tokens) == {5}  # as it reported
    assert (bot.latency_s >= 0).all() and not bot.cache_hit.any()
    with sqlite3.connect(tmp_path / "run" / "cache.sqlite") as db:
        cached = db.execute("SELECT count(*) FROM completions").fetchone()[0]
    # Only the server's replies were cached: code's replies are not, unless deterministic.
    assert cached == calls[calls.backend == "srv"].request_hash.nunique()


def test_the_context_names_the_dialogues_scenario(agents: str, tmp_path: Path) -> None:
    target = f"{agents}:responder"
    scenario = {"id": "late-parcel", "situation": "A parcel ordered a week ago has not arrived.",
                "goal": "Learn when the parcel will arrive.",
                "expected_outcome": "The agent gives a delivery date."}
    with TestServer() as srv:
        data = endpoint_config(srv.base_url, personas={"n": 1}, scenarios=[scenario],
                               scenarios_judge={"enabled": False})
        data["backends"]["bot"] = python_backend(target)
        data["pairings"] = [{"client": "srv", "responder": "bot"}]
        summary = run(data, tmp_path / "run")
    assert summary.completed == summary.planned == 1, summary.line()
    assert {c.scenario_id for _, c, _ in module_of(target)["CALLS"]} == {"late-parcel"}


def test_both_sides_may_be_code_and_an_async_function_runs_on_its_own_event_loop(
        agents: str, tmp_path: Path) -> None:
    data = endpoint_config("http://127.0.0.1:9/v1", personas={"n": 1},
                           dialogue={"max_turns_per_agent": 2, "max_tokens": 40})
    data["backends"] = {"me": python_backend(f"{agents}:client"),
                        "bot": python_backend(f"{agents}:responder")}
    data["pairings"] = [{"client": "me", "responder": "bot"}]
    summary = run(data, tmp_path / "run")
    assert summary.completed == summary.planned == 1, summary.line()
    turns = pd.read_parquet(tmp_path / "run" / "turns.parquet").sort_values("turn_index")
    assert list(turns.speaker) == ["client", "responder"] * 2
    assert turns.text.iloc[0] == "Client line 0, about my parcel."
    made = module_of(f"{agents}:client")["CALLS"]
    clients = [(m, c, t) for m, c, t in made if c.speaker == "client"]
    assert [c.turn_index for _, c, _ in clients] == [0, 2]
    # Awaited on the backend's own loop, never spasm's (a loop it blocks is its own).
    assert {t for _, _, t in clients} == {"spasm-agent-loop-me"}
    first = clients[0][0]
    assert first[0]["role"] == "system" and first[1]["role"] == "user"  # the opening
    calls = pd.read_parquet(tmp_path / "run" / "calls.parquet")
    me = calls[calls.backend == "me"]
    assert set(me.prompt_tokens) == {3} and set(me.completion_tokens) == {2}  # an object's usage


@pytest.mark.parametrize("deterministic, outcomes", [(False, ["ok", "ok"]), (True, ["ok", "cache_hit"])])
def test_replies_are_cached_only_when_the_config_says_the_function_is_deterministic(
        agents: str, tmp_path: Path, deterministic: bool, outcomes: list[str]) -> None:
    target = f"{agents}:responder"
    caller, scope = caller_for(target, tmp_path, deterministic=deterministic)

    async def twice() -> None:
        for _ in range(2):
            await caller.complete("responder", "bot", request(), scope)

    anyio.run(twice)
    assert [r.outcome for r in scope.records] == outcomes
    assert len(module_of(target)["CALLS"]) == (1 if deterministic else 2)


def test_an_exception_is_retried_then_the_dialogue_is_quarantined_naming_the_function(
        agents: str, tmp_path: Path) -> None:
    target = f"{agents}:broken"
    with TestServer() as srv:
        data = endpoint_config(srv.base_url, personas={"n": 1})
        data["backends"]["bot"] = python_backend(target, max_attempts=2)
        data["pairings"] = [{"client": "srv", "responder": "bot"}]
        summary = run(data, tmp_path / "run")
    assert summary.completed == 0 and summary.errors == 1
    errors = pd.read_parquet(tmp_path / "run" / "errors.parquet")
    error = errors.error.iloc[0]
    assert errors.error_type.iloc[0] == "TransientBackendError"
    assert target in error and "ValueError: inventory service down" in error
    assert f"{agents}:" in error.split("down", 1)[1]  # where it was raised: file:line
    calls = pd.read_parquet(tmp_path / "run" / "calls.parquet")
    assert list(calls[calls.backend == "bot"].outcome) == ["server_error", "server_error"]


def test_a_connection_error_is_retried_like_a_dropped_connection(agents: str, tmp_path: Path) -> None:
    caller, scope = caller_for(f"{agents}:flaky", tmp_path)
    reply = anyio.run(caller.complete, "responder", "bot", request(), scope)
    assert reply.text == "Recovered."
    assert [r.outcome for r in scope.records] == ["connection_error", "ok"]
    assert "ConnectionError: reset by peer" in (scope.records[0].error or "")


@pytest.mark.parametrize("function, message", [
    ("number", "returned an int (42), not the reply: return a str"),
    ("negative", "reported prompt_tokens=-1"),
])
def test_a_return_that_is_not_a_reply_is_a_clear_error_and_not_retried(
        agents: str, tmp_path: Path, function: str, message: str) -> None:
    caller, scope = caller_for(f"{agents}:{function}", tmp_path)
    with pytest.raises(FatalBackendError, match=re.escape(message)):
        anyio.run(caller.complete, "responder", "bot", request(), scope)
    assert [r.outcome for r in scope.records] == ["fatal"]


def test_a_call_longer_than_timeout_s_is_a_timeout(agents: str, tmp_path: Path) -> None:
    caller, scope = caller_for(f"{agents}:slow", tmp_path, timeout_s=0.05, max_attempts=1)
    with pytest.raises(TimeoutBackendError, match=r"did not return within timeout_s=0\.05s"):
        anyio.run(caller.complete, "responder", "bot", request(), scope)
    assert [r.outcome for r in scope.records] == ["timeout"]


def test_calls_run_under_the_backends_concurrency_limit(agents: str, tmp_path: Path) -> None:
    target = f"{agents}:gated"
    caller, _ = caller_for(target, tmp_path, max_concurrency=2)

    async def many() -> None:
        async with anyio.create_task_group() as tg:
            for seed in range(6):
                tg.start_soon(caller.complete, "responder", "bot", request(seed), CallScope("d"))

    anyio.run(many)
    assert module_of(target)["STATE"]["peak"] == 2


@pytest.mark.parametrize("backend, message", [
    ({"kind": "python"}, "a 'python' backend needs target"),
    ({"kind": "python", "target": "responder"}, "target is 'package.module:function'"),
    ({"kind": "python", "target": "my agent.py:"}, "target is 'package.module:function'"),
    ({"kind": "python", "target": "my-pkg.agent:respond"}, "neither a dotted module name nor a .py"),
    ({"kind": "openai", "base_url": "http://h/v1", "target": "a.b:c"}, "settings of a 'python' backend"),
])
def test_a_malformed_target_is_a_config_error_saying_the_form(backend: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config({"backends": {"bot": backend}, "pairings": [{"client": "bot", "responder": "bot"}]})


@pytest.mark.parametrize("target, message", [
    ("{dir}/missing.py:respond", "missing.py does not exist"),
    ("{dir}:respond", "is neither a dotted module name nor a .py file"),
    ("{dir}/agents.py:nothing_here", "has no 'nothing_here'; it defines .*responder"),
    ("spasm_no_such_module.agent:respond", "cannot import 'spasm_no_such_module.agent'"),
    ("{dir}/syntax.py:respond", r"importing .* failed: SyntaxError: .*syntax.py"),
    ("{dir}/agents.py:STATE", "is a dict .*, not a function"),
])
def test_a_target_that_does_not_load_is_exit_2_at_start_before_any_call(
        agents: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str, message: str) -> None:
    (tmp_path / "syntax.py").write_text("def respond(messages, context)\n    return 'x'\n")
    target = target.format(dir=tmp_path)
    with TestServer() as srv:
        data = endpoint_config(srv.base_url, personas={"n": 1})
        data["backends"]["bot"] = python_backend(target)
        data["pairings"] = [{"client": "srv", "responder": "bot"}]
        config = tmp_path / "config.yaml"
        config.write_text(yaml.safe_dump(data))
        code = main(["generate", "--config", str(config), "--out", str(tmp_path / "run")])
        assert srv.stats["requests"] == 0  # nothing was sent
    err = capsys.readouterr().err
    assert code == 2, err
    assert target in err and "Traceback" not in err
    assert re.search(message, err), err
    assert not (tmp_path / "run").exists()


def test_the_example_responder_config_runs_with_the_test_server_as_client(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the example's target is relative to the repository root
    data = yaml.safe_load((ROOT / "configs" / "examples" / "python-responder.yaml").read_text())
    assert data["backends"]["bot"]["target"] == "examples/responder.py:respond"
    with TestServer() as srv:
        data["backends"]["client"] = {"kind": "openai", "base_url": srv.base_url, "model": "m"}
        data["personas"]["n"] = 2
        summary = run(data, tmp_path / "run")
    assert summary.completed == summary.planned == 2, summary.line()
    bot = load_target("examples/responder.py:respond").__globals__
    allowed = {bot["GREETING"], bot["FALLBACK"], *(reply for _, reply in bot["RULES"])}
    turns = pd.read_parquet(tmp_path / "run" / "turns.parquet")
    assert set(turns[turns.speaker == "responder"].text) <= allowed
    calls = pd.read_parquet(tmp_path / "run" / "calls.parquet")
    with sqlite3.connect(tmp_path / "run" / "cache.sqlite") as db:
        cached = db.execute("SELECT count(*) FROM completions").fetchone()[0]
    assert cached == calls.request_hash.nunique()  # deterministic: the bot's replies are cached


def test_the_context_type_is_read_only_and_names_its_fields() -> None:
    fields = [f.name for f in dataclasses.fields(AgentContext)]
    assert fields[:5] == ["dialogue_id", "speaker", "turn_index", "seed", "scenario_id"]
    # The context never changes a request's identity (like stream_key).
    assert request().cache_key("x") == dataclasses.replace(request(), context=None).cache_key("x")
    assert "context" not in request().params()


def test_a_backend_error_the_function_raises_keeps_its_class(tmp_path: Path) -> None:
    path = tmp_path / "limited.py"
    path.write_text("from spasm.errors import FatalBackendError\n"
                    "def respond(messages, context):\n"
                    "    raise FatalBackendError('quota used up')\n")
    caller, scope = caller_for(f"{path}:respond", tmp_path)
    with pytest.raises(FatalBackendError, match="quota used up"):
        anyio.run(caller.complete, "responder", "bot", request(), scope)
    assert [r.outcome for r in scope.records] == ["fatal"]  # fatal: not retried
