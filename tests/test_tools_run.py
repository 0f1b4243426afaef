"""Agents that act, end to end: a run with tools over the real ``openai``
SDK to the test server on 127.0.0.1 and a ``kind: python`` Responder, its events and worlds
read back from Parquet, seen() verifying tool frames, the reward, the dry run counting tool
steps, and every bad input an exit 2 before any call."""

from __future__ import annotations

import datetime
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from spasm.cli import main
from spasm.config import parse_config
from spasm.dataset import open_run
from spasm.engine import Engine
from spasm.errors import UserError
from spasm.testing import TestServer

ROOT = Path(__file__).resolve().parent.parent
SHOP = ROOT / "examples" / "shop"


def _client(body: dict[str, Any]) -> str | dict[str, Any]:
    """The test server as the Client: it names its order, then thanks and leaves."""
    said = [m for m in body["messages"] if m["role"] == "assistant"]
    if len(said) == 0:
        return "Hi, my kettle, order 4471, never arrived."
    if len(said) == 1:
        return "Yes, it is order 4471. Please cancel it."
    return "Thank you, goodbye."


def _config(base_url: str, tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    data = yaml.safe_load((SHOP / "config.yaml").read_text())
    data["backends"]["client"] = {"kind": "openai", "base_url": base_url, "model": "m"}
    scenarios = yaml.safe_load((SHOP / "scenarios.yaml").read_text())["scenarios"]
    for s in scenarios:
        s["world"] = str(SHOP / "world.json")
    data["scenarios"] = scenarios[:1]
    data["tools"] = [str(SHOP / "tools.py")]
    data["backends"]["agent"]["target"] = f"{SHOP / 'responder.py'}:respond"
    data.update(overrides)
    return data


def _generate(data: dict[str, Any], out: Path) -> Any:
    return anyio.run(Engine(parse_config(data), out, progress=False, sleep_scale=0.0).run)


def test_a_python_responder_acts_on_the_world_and_the_run_records_it(tmp_path: Path) -> None:
    with TestServer(reply=_client) as srv:
        summary = _generate(_config(srv.base_url, tmp_path, conditions=["ecp", "quoted"]),
                            tmp_path / "run")
    assert summary.completed == summary.planned == 4, summary.line()
    # Under quoted the bot sees its results as lines, not tool messages, and keeps looking the
    # order up until the step cap: counted and said, not silent.
    assert any("used every tool step" in w for w in summary.warnings())
    run = open_run(tmp_path / "run")
    dialogues = run.dialogues.set_index("dialogue_id")
    ecp = next(i for i in dialogues.index if i.endswith("-ecp"))
    quoted = next(i for i in dialogues.index if i.endswith("-quoted"))
    assert json.loads(dialogues.loc[quoted, "reward_detail"])["turns_at_step_cap"] > 0
    assert json.loads(dialogues.loc[ecp, "reward_detail"])["turns_at_step_cap"] == 0
    # The agent found the order, cancelled and refunded it: the world is the gold world.
    assert dialogues.loc[ecp, "world_match"] is True or dialogues.loc[ecp, "world_match"] == True  # noqa: E712
    assert dialogues.loc[ecp, "reward"] == 1.0
    detail = json.loads(dialogues.loc[ecp, "reward_detail"])
    assert detail["parts"] == {"actions": 1.0, "must_say": 1.0, "world": 1.0}
    events = run.df("events")
    mine = events[(events.dialogue_id == ecp) & (events.turn_index == 1)].sort_values("seq")
    assert list(mine.kind) == ["tool_call", "notice", "tool_result", "tool_call", "notice",
                               "tool_call", "tool_result", "tool_result"]
    assert set(mine.actor) == {"responder"}
    calls = mine[mine.kind == "tool_call"]
    results = mine[mine.kind == "tool_result"]
    assert set(calls.call_id) == set(results.call_id)  # every call has its result
    refund = results[results.tool == "refund"].iloc[0]
    assert json.loads(refund.visible_to) == ["client", "responder"]  # visible_to="all"
    find = results[results.tool == "find_order"].iloc[0]
    assert json.loads(find.visible_to) == ["responder"]
    worlds = run.df("worlds")
    kinds = list(worlds[worlds.dialogue_id == ecp].sort_values("seq").kind)  # 2 changes
    assert kinds == ["initial", "change", "change", "final", "gold"]
    # Every call of a tool step is a calls row, and seen() rebuilds each frame byte for byte.
    view = run.dialogue(ecp)
    responder_turn = next(i for i, t in enumerate(view.turns) if t["speaker"] == "responder"
                          and any(e["turn_index"] == i for e in view.events))
    seen = view.seen(responder_turn)
    assert seen.verified is True and len(seen.steps) == 2
    # Under ECP each earlier step's frame is a prefix of the verified one.
    assert all(step == seen.messages[:len(step)] for step in seen.steps)
    roles = [m["role"] for m in seen.messages]
    assert roles[-3:] == ["assistant", "tool", "tool"]
    steps = sum(len(view.seen(i).steps) for i in range(len(view.turns)))
    assert steps >= 2 and len(run.calls[run.calls.dialogue_id == ecp]) == len(view.turns) + steps
    # The Client never sees the find_order payload under ECP or quoted, only the notices.
    for dialogue_id in dialogues.index:
        view = run.dialogue(dialogue_id)
        for i, t in enumerate(view.turns):
            frame = json.dumps(view.seen(i).messages)
            assert view.seen(i).verified is True
            if t["speaker"] == "client" and i > responder_turn:
                # find_order's result (items, status) was the agent's alone.
                assert '\\"items\\"' not in frame and "at depot" not in frame
                assert "[The agent is looking up your order]" in frame


def test_native_tool_calls_travel_over_http_and_concat_shows_every_event(tmp_path: Path) -> None:
    def reply(body: dict[str, Any]) -> str | dict[str, Any]:
        if not body.get("tools"):
            return _client(body)
        if body["messages"][-1]["role"] == "tool":
            return "Your order is at the depot; I have cancelled it."
        return {"tool_calls": [{"name": "find_order", "arguments": {"order_id": "4471"}},
                               {"name": "cancel_order", "arguments": {"order_id": "4471"}}]}

    with TestServer(reply=reply) as srv:
        data = _config(srv.base_url, tmp_path, conditions=["ecp", "concat"])
        data["backends"]["agent"] = {"kind": "openai", "base_url": srv.base_url, "model": "m"}
        summary = _generate(data, tmp_path / "run")
        bodies = srv.requests
    assert summary.completed == summary.planned == 4, summary.line()
    with_tools = [b for b in bodies if b.get("tools")]
    assert {t["function"]["name"] for t in with_tools[0]["tools"]} == {
        "find_order", "cancel_order", "refund"}
    answered = [b for b in with_tools if b["messages"][-1]["role"] == "tool"]
    assert answered and answered[0]["messages"][-3]["tool_calls"][0]["function"]["name"] == "find_order"
    run = open_run(tmp_path / "run")
    events = run.df("events")
    assert set(events.kind) == {"tool_call", "tool_result", "notice"}
    concat = next(i for i in run.dialogues.dialogue_id if i.endswith("-concat"))
    view = run.dialogue(concat)
    client_turns = [i for i, t in enumerate(view.turns) if t["speaker"] == "client" and i > 1]
    frame = json.dumps(view.seen(client_turns[0]).messages)
    assert "Responder (result of find_order)" in frame  # CONCAT: every event, for everyone
    assert all(view.seen(i).verified for i in range(len(view.turns)))
    params = [json.loads(p) for p in run.calls.params]
    assert any(p.get("tools") == ["cancel_order", "find_order", "refund"] for p in params)
    assert all("tools" not in p for p in params if not p.get("tools"))


def test_a_run_without_tools_writes_no_tool_tables_or_columns(tmp_path: Path) -> None:
    with TestServer(reply=_client) as srv:
        data = _config(srv.base_url, tmp_path)
        for key in ("tools",):
            data.pop(key)
        for s in data["scenarios"]:
            for key in ("world", "reference_actions", "success", "tools"):
                s.pop(key, None)
        _generate(data, tmp_path / "run")
    run_dir = tmp_path / "run"
    assert not (run_dir / "events.parquet").exists() and not (run_dir / "worlds.parquet").exists()
    import pyarrow.parquet as pq

    stored = pq.read_table(next((run_dir / "dialogues.parquet").glob("*.parquet"))).column_names
    assert "reward" not in stored and "world_match" not in stored


def test_the_dry_run_counts_tool_steps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yaml"
    data = _config("http://127.0.0.1:9/v1", tmp_path)
    config.write_text(yaml.safe_dump(data))
    assert main(["generate", "--config", str(config), "--out", str(tmp_path / "o"), "--dry-run"]) == 0
    tools_on = capsys.readouterr().out
    data["tools"] = []
    for s in data["scenarios"]:
        for key in ("world", "reference_actions", "success", "tools"):
            s.pop(key, None)
    config.write_text(yaml.safe_dump(data))
    assert main(["generate", "--config", str(config), "--out", str(tmp_path / "o"), "--dry-run"]) == 0
    tools_off = capsys.readouterr().out

    def calls(out: str) -> int:
        line = next(x for x in out.splitlines() if "client/agent" in x)
        return int(line.split()[2].replace(",", ""))

    assert calls(tools_on) > calls(tools_off), (tools_on, tools_off)


BAD: dict[str, tuple[Any, str]] = {
    "tool module that does not import": ({"tools": ["broken.py"]}, "broken.py failed"),
    "hint without schema": ({"tools": ["hintless.py"]}, "hintless.py:4: tool 'f'"),
    "scenario naming an unknown tool": ({"scenario": {"tools": ["teleport"]}},
                                        "names unknown tool(s) ['teleport']"),
    "a tool the seat does not own": (
        {"scenario": {"reference_actions": [{"tool": "check_app", "actor": "responder"}],
                      "tools": None}}, "'responder' does not own 'check_app'"),
    "world not JSON": ({"world": "{not json"}, "line 1: the world of scenario 'late-kettle'"),
    "inline world not JSON": ({"scenario": {"world": {"since": datetime.date(2024, 1, 2)}}},
                              "the world is not JSON"),
    "world not a mapping": ({"world": "[1, 2]"}, "the world is a JSON object (a mapping), not list"),
    "reference actions that fail": (
        {"scenario": {"reference_actions": [{"tool": "cancel_order",
                                             "arguments": {"order_id": "5120"}}]}},
        "reference actions fail on the initial world: action 1 (cancel_order): ValueError"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_exit_2_before_any_call_naming_file_and_line(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    change, message = BAD[case]
    (tmp_path / "broken.py").write_text("import spasm\nraise ImportError('no such db')\n")
    (tmp_path / "hintless.py").write_text("import spasm\n\n\n@spasm.tool\ndef f(world, x):\n    return x\n")
    with TestServer(reply=_client) as srv:
        data = _config(srv.base_url, tmp_path)
        if "tools" in change:
            data["tools"] = [str(tmp_path / t) for t in change["tools"]]
        if "world" in change:
            (tmp_path / "world.json").write_text(change["world"])
            data["scenarios"][0]["world"] = str(tmp_path / "world.json")
        for key, value in change.get("scenario", {}).items():
            data["scenarios"][0][key] = value
            if value is None:
                data["scenarios"][0].pop(key)
        scenarios = tmp_path / "scenarios.yaml"
        scenarios.write_text(yaml.safe_dump({"scenarios": data["scenarios"]}))
        data["scenarios"] = str(scenarios)
        config = tmp_path / "c.yaml"
        config.write_text(yaml.safe_dump(data))
        code = main(["generate", "--config", str(config), "--out", str(tmp_path / "out")])
        asked = len(srv.requests)
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err, err
    assert "Traceback" not in err
    assert asked == 0  # nothing was called
    if "scenario" in change or "world" in change:
        assert "line" in err
    shutil.rmtree(tmp_path / "out", ignore_errors=True)


def test_prompted_mode_asks_for_a_message_or_calls_through_the_structured_path(
    tmp_path: Path,
) -> None:
    def reply(body: dict[str, Any]) -> str | dict[str, Any]:
        if body.get("response_format") is None:
            return _client(body)
        assert "tools" not in body  # prompted: the tools are in the frame, not the request
        if body["messages"][-1]["content"].startswith("Result of cancel_order"):
            return json.dumps({"message": "Done: order 4471 is cancelled, refund on its way."})
        return json.dumps({"tool_calls": [{"name": "cancel_order",
                                           "arguments": {"order_id": "4471"}}]})

    with TestServer(reply=reply) as srv:
        data = _config(srv.base_url, tmp_path)
        data["backends"]["agent"] = {"kind": "openai", "base_url": srv.base_url, "model": "m",
                                     "tool_mode": "prompted", "structured_output": "json_object"}
        summary = _generate(data, tmp_path / "run")
        bodies = srv.requests
    assert summary.completed == summary.planned == 2, summary.line()
    prompted = [b for b in bodies if b.get("response_format")]
    assert prompted and "Your tools:" in prompted[0]["messages"][0]["content"]
    assert all(m["role"] != "tool" for b in prompted for m in b["messages"])
    run = open_run(tmp_path / "run")
    results = run.df("events").query("kind == 'tool_result'")
    assert set(results.tool) == {"cancel_order"} and results.error.isna().all()
    turns = run.turns
    assert "refund on its way" in " ".join(turns[turns.speaker == "responder"].text)
    view = run.dialogue(run.dialogues.dialogue_id[0])
    assert all(view.seen(i).verified for i in range(len(view.turns)))


def group_reply(client_tool: str) -> Callable[[dict[str, Any]], str | dict[str, Any]]:
    """The group recipe's server: a client seat calls ``client_tool`` (no arguments), Helper
    looks the order up, and everyone answers once a tool has returned."""

    def reply(body: dict[str, Any]) -> str | dict[str, Any]:
        tools = {t["function"]["name"] for t in body.get("tools") or []}
        if body["messages"][-1]["role"] == "tool" or not tools:
            return "Thanks, let us see. Order 4471, please."
        if client_tool in tools:
            return {"tool_calls": [{"name": client_tool, "arguments": {}}]}
        return {"tool_calls": [{"name": "find_order", "arguments": {"order_id": "4471"}}]}

    return reply


#: Ana and Ben check their own app.
_group_reply = group_reply("check_app")


def _group_config(base_url: str, tmp_path: Path, conditions: list[str]) -> dict[str, Any]:
    """:func:`_config` as a group: Ana and Ben (clients) and Helper (responder) on one backend,
    one dialogue of 6 utterances per persona and condition, both tools and no reference."""
    data = _config(base_url, tmp_path, conditions=conditions)
    data["backends"] = {"srv": {"kind": "openai", "base_url": base_url, "model": "m"}}
    data.pop("pairings")
    data["participants"] = [{"id": "Ana", "role": "client", "backend": "srv"},
                            {"id": "Ben", "role": "client", "backend": "srv"},
                            {"id": "Helper", "role": "responder", "backend": "srv"}]
    data["group"] = {"max_utterances": 6, "dialogues": 1}
    data["personas"] = {"n": 2}
    data["scenarios"][0]["tools"] = ["find_order", "check_app"]
    for key in ("reference_actions", "success"):
        data["scenarios"][0].pop(key)
    return data


def test_a_group_run_with_tools_keeps_each_seats_actions_to_what_it_may_see(
    tmp_path: Path,
) -> None:
    with TestServer(reply=_group_reply) as srv:
        data = _group_config(srv.base_url, tmp_path, ["ecp", "quoted"])
        summary = _generate(data, tmp_path / "run")
    assert summary.completed == summary.planned == 2, summary.line()
    run = open_run(tmp_path / "run")
    events = run.df("events")
    assert set(events.actor) == {"Ana", "Ben", "Helper"}  # client seats act too (dual control)
    checked = 0
    for dialogue_id in run.dialogues.dialogue_id:
        view = run.dialogue(dialogue_id)
        for i, t in enumerate(view.turns):
            seen = view.seen(i)
            assert seen.verified is True
            frame = json.dumps(seen.messages)
            for e in view.events:
                if e["turn_index"] >= i:
                    continue
                visible = t["speaker"] == e["actor"] or t["speaker"] in json.loads(e["visible_to"])
                if not visible and e["kind"] == "tool_result" and e["tool"] == "find_order":
                    assert "39.9" not in frame  # another seat's result (what was paid)
                    checked += 1
    assert checked > 0


def test_a_resume_refuses_tools_or_worlds_edited_since_the_run_started(tmp_path: Path) -> None:
    world = tmp_path / "world.json"
    world.write_text((SHOP / "world.json").read_text())
    with TestServer(reply=_client) as srv:
        data = _config(srv.base_url, tmp_path)
        data["scenarios"][0]["world"] = str(world)
        _generate(data, tmp_path / "run")
        manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
        assert set(manifest["tools"]) == {"tools", "sources", "worlds", "sha256"}
        original = world.read_text()
        world.write_text(original.replace("39.9", "49.9"))
        with pytest.raises(UserError, match=r"scenario worlds: late-kettle"):
            _generate(data, tmp_path / "run")
        world.write_text(original)
        again = _generate(data, tmp_path / "run")  # as it was: resumes, nothing new
    assert again.new == 0 and again.completed == again.planned


@pytest.mark.e2e
def test_shards_of_a_run_with_tools_merge_with_their_events_and_worlds(tmp_path: Path) -> None:
    with TestServer(reply=_client) as srv:
        config = tmp_path / "c.yaml"
        config.write_text(yaml.safe_dump(_config(srv.base_url, tmp_path, personas={"n": 4})))
        shards = [tmp_path / f"s{i}" for i in range(2)]
        for i, out in enumerate(shards):
            assert main(["generate", "--config", str(config), "--out", str(out), "--shard",
                         f"{i}/2", "--no-progress"]) == 0
    assert main(["merge", *map(str, shards), "--out", str(tmp_path / "merged")]) == 0
    merged = open_run(tmp_path / "merged")
    parts = [open_run(s) for s in shards]
    for table in ("events", "worlds"):
        assert merged.table(table).num_rows == sum(p.table(table).num_rows for p in parts) > 0
    d = merged.dialogue(merged.dialogues.dialogue_id[0])
    assert all(d.seen(i).verified for i in range(len(d.turns)))
