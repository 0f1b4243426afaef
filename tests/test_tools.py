"""Tools and a world: schemas from hints and docstrings, calls that fail
become results with an error, the world is copied and hashed, bad definitions name their line."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Literal

import anyio
import pytest

from spasm.backends.base import ToolCall
from spasm.errors import ConfigError
from spasm.tools import Tool, ToolBelt, load_tools, replay, tool, world_sha256


@tool(owner="responder", mutates=True, notice="[The agent is updating your order]")
def cancel_order(world: dict, order_id: str, reason: Literal["late", "other"] = "other") -> dict:
    """Cancel an order that has not shipped.

    Args:
        order_id: The order's id, as the customer gives it.
        reason: Why the customer cancels.
    """
    order = world["orders"][order_id]
    if order["status"] == "shipped":
        raise ValueError("already shipped")
    order["status"] = "cancelled"
    return {"order_id": order_id, "status": "cancelled"}


@tool(owner="client", visible_to="all")
def check_app(world: dict) -> str:
    """Look at the order in the shop's app."""
    return "open"


@tool(timeout_s=0.2)
def slow(world: dict) -> str:
    """Take too long."""
    time.sleep(2)
    return "late"


WORLD = {"orders": {"A1": {"status": "placed"}, "B2": {"status": "shipped"}}}
SEATS = {"client": "client", "responder": "responder"}


def test_the_schema_comes_from_the_type_hints_and_the_docstring() -> None:
    spec = cancel_order.spec()["function"]
    assert spec["name"] == "cancel_order"
    assert spec["description"] == "Cancel an order that has not shipped."
    params = spec["parameters"]
    assert params["required"] == ["order_id"]
    assert params["properties"]["order_id"] == {
        "type": "string", "description": "The order's id, as the customer gives it."}
    assert params["properties"]["reason"]["enum"] == ["late", "other"]
    assert params["additionalProperties"] is False
    assert isinstance(cancel_order, Tool) and cancel_order.owner == ("responder",)


def _run(belt: ToolBelt, actor: str, *calls: tuple[str, str]) -> list[dict[str, object]]:
    events = anyio.run(belt.run, actor, 1, [ToolCall(f"c{i}", n, a) for i, (n, a) in enumerate(calls)])
    return [{"kind": e.kind, "result": e.result, "error": e.error, "visible": e.visible_to,
             "sha": e.world_sha256} for e in events]


def test_a_mutating_call_changes_a_copy_of_the_world_and_its_hash() -> None:
    belt = ToolBelt({"cancel_order": cancel_order}, WORLD, SEATS)
    before = belt.world.sha256
    assert before == world_sha256(WORLD)
    events = _run(belt, "responder", ("cancel_order", '{"order_id": "A1"}'))
    assert [e["kind"] for e in events] == ["tool_call", "notice", "tool_result"]
    assert events[1]["visible"] == ("client",)  # the notice goes to the others
    assert events[2]["visible"] == ("responder",)  # the payload to the actor alone
    assert json.loads(str(events[2]["result"]))["status"] == "cancelled"
    assert belt.world.state["orders"]["A1"]["status"] == "cancelled"
    assert WORLD["orders"]["A1"]["status"] == "placed"  # the scenario's world is untouched
    assert events[2]["sha"] == belt.world.sha256 != before
    assert [s[0] for s in belt.world.states] == ["initial", "change"]


def test_failures_are_results_with_an_error_never_a_crash() -> None:
    belt = ToolBelt({"cancel_order": cancel_order, "slow": slow, "check_app": check_app},
                    WORLD, SEATS)
    events = _run(belt, "responder",
                  ("cancel_order", '{"order_id": 7}'),  # schema
                  ("cancel_order", '{"order_id": "B2"}'),  # raises
                  ("cancel_order", "{not json"),
                  ("slow", "{}"),  # timeout
                  ("check_app", "{}"),  # a client tool
                  ("nope", "{}"))
    errors = [e["error"] for e in events if e["kind"] == "tool_result"]
    assert "arguments do not follow the schema" in str(errors[0])
    assert errors[1] == "ValueError: already shipped"
    assert "not valid JSON" in str(errors[2])
    assert "timeout_s=0.2s" in str(errors[3])
    assert "no tool 'check_app' for you" in str(errors[4])
    assert "no tool 'nope'" in str(errors[5])
    assert belt.errors == 6 and belt.world.sha256 == world_sha256(WORLD)


def test_reference_actions_replay_on_a_copy() -> None:
    gold, problems = anyio.run(replay, {"cancel_order": cancel_order}, WORLD,
                               [{"tool": "cancel_order", "arguments": {"order_id": "A1"}}])
    assert problems == [] and gold["orders"]["A1"]["status"] == "cancelled"
    _, problems = anyio.run(replay, {"cancel_order": cancel_order}, WORLD,
                            [{"tool": "cancel_order", "arguments": {"order_id": "B2"}}])
    assert problems == ["action 1 (cancel_order): ValueError: already shipped"]


def test_bad_tool_modules_are_config_errors_naming_file_and_line(tmp_path: Path) -> None:
    hintless = tmp_path / "hintless.py"
    hintless.write_text("import spasm\n\n@spasm.tool\ndef f(world, order_id):\n    return 1\n")
    with pytest.raises(ConfigError, match=r"hintless.py:3: tool 'f': parameter 'order_id' has no type hint"):
        load_tools([str(hintless)])
    opaque = tmp_path / "opaque.py"
    opaque.write_text("import spasm\n\nclass Thing: ...\n\n@spasm.tool\ndef g(world, x: Thing):\n"
                      "    return 1\n")
    with pytest.raises(ConfigError, match=r"opaque.py:5: tool 'g': a type hint gives no JSON schema"):
        load_tools([str(opaque)])
    broken = tmp_path / "broken.py"
    broken.write_text("import spasm\nraise RuntimeError('no db')\n")
    with pytest.raises(ConfigError,
                       match=r"importing .*broken.py failed: RuntimeError: no db at .*broken.py:2"):
        load_tools([str(broken)])
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    with pytest.raises(ConfigError, match="defines no tool"):
        load_tools([str(empty)])
    with pytest.raises(ConfigError, match="cannot import it"):
        load_tools(["no_such_module_here"])


def test_a_tool_a_plugin_registered_is_named_by_its_name() -> None:
    # A plugin registers by importing a module that uses the decorator (as this module did).
    tools = load_tools(["cancel_order", "check_app"])
    assert set(tools) == {"cancel_order", "check_app"} and tools["check_app"].owner == ("client",)
