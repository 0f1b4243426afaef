"""A group run with tools generated on the test server (the recipe of
tests/test_tools_run.py: Ana and Ben check their own app, Helper looks the order up): each
seat's export keeps its own calls and never another seat's, ``--check`` passes, payload_leak
checks every client seat against its own frame, and the viewer shows each seat's events and
verified frames."""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from spasm.cli import main
from spasm.dataset import open_run
from spasm.testing import TestServer
from tests.test_tools_run import _generate, _group_config, _group_reply


@pytest.fixture(scope="module")
def group_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("group-tools")
    with TestServer(reply=_group_reply) as srv:
        summary = _generate(_group_config(srv.base_url, tmp, ["ecp", "concat"]), tmp / "run")
    assert summary.completed == summary.planned == 2, summary.line()
    return tmp / "run"


def _records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (out / "openai" / "train.jsonl").read_text().splitlines()]


def test_each_seat_trains_on_its_own_calls_only(group_run: Path, tmp_path: Path) -> None:
    events = open_run(group_run).df("events")
    assert {"Ana", "Ben", "Helper"} <= set(events.actor)
    for seat, own, other in (("Ana", "check_app", "find_order"),
                             ("Helper", "find_order", "check_app")):
        out = tmp_path / seat
        assert main(["export", str(group_run), "--out", str(out), "--role", seat,
                     "--split", "1,0,0", "--echoing", "keep", "--allow-qa", "all"]) == 0
        assert main(["export", "--check", str(out / "openai" / "train.jsonl")]) == 0
        records = _records(out)
        assert records
        for r in records:
            assert [t["function"]["name"] for t in r["tools"]] == [own]
            names = {c["function"]["name"] for m in r["messages"] for c in m.get("tool_calls", [])}
            assert names == {own}
            assert not any(m["role"] == "tool" and other in json.dumps(m) for m in r["messages"])
            # Another seat's action reaches it only inside a user message, never as a tool one.
            ids = {c["id"] for m in r["messages"] for c in m.get("tool_calls", [])}
            assert {m["tool_call_id"] for m in r["messages"] if m["role"] == "tool"} <= ids


@pytest.mark.e2e
def test_payload_leak_and_the_viewer_read_every_seats_own_frame(group_run: Path) -> None:
    assert main(["eval", str(group_run), "--no-progress"]) == 0
    metrics = json.loads((group_run / "eval" / "metrics.json").read_text())
    rates = {r["condition"]: r for r in metrics["payload_leak"]["rates"]}
    assert set(rates) == {"all", "ecp", "concat"} and rates["all"]["n"] == 2
    pytest.importorskip("fastapi", reason="the viewer needs the 'view' extra")
    from spasm.viewer.server import ViewerServer
    from tests.test_viewer_http import get
    from tests.test_viewer_tools import _EVENT

    run = open_run(group_run)
    with ViewerServer(group_run) as srv:
        for did in run.dialogues.dialogue_id:
            view = run.dialogue(str(did))
            q = urllib.parse.quote(str(did), safe="")
            status, page, _ = get(f"{srv.base_url}/d/{q}")
            assert status == 200 and len(_EVENT.findall(page)) == len(view.events)
            assert "hidden from Ana" in page or "hidden from Ben" in page
            for i in range(len(view.turns)):
                _, fragment, _ = get(f"{srv.base_url}/d/{q}/seen/{i}?fragment=1")
                assert "✓ verified" in fragment
