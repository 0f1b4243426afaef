"""`spasm view` of agents that act, over HTTP against a real uvicorn server on
127.0.0.1: each turn's tool calls and results inline with who could see them (and what the
others were shown instead), "what X saw" with its tool messages, rebuilt and verified, and the
world at the end beside the gold world as a diff. On the hand-written run (tests/tool_run.py)
and on a run the engine generated with tools on the test server (examples/shop, trials 2),
which eval's pass^k and payload_leak and the export read too.
"""

from __future__ import annotations

import html
import json
import re
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the viewer needs the 'view' extra: pip install 'spasm[view]'")
pytest.importorskip("duckdb", reason="the viewer needs the 'view' extra: pip install 'spasm[view]'")

from spasm.cli import main
from spasm.dataset import open_run
from spasm.testing import TestServer
from spasm.viewer.server import ViewerServer
from tests.test_viewer_http import get
from tests.tool_run import IDS, write_tool_run

_EVENT = re.compile(r'<li class="event kind-(\w+)" data-seq="(\d+)" data-actor="(\w+)">(.*?)</li>', re.S)


def _q(dialogue_id: str) -> str:
    return urllib.parse.quote(dialogue_id, safe="")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ViewerServer]:
    run = write_tool_run(tmp_path_factory.mktemp("view-tools") / "run")
    with ViewerServer(run) as srv:
        yield srv


def _turn(page: str, index: int) -> str:
    found = re.search(rf'id="turn-{index}" data-turn="{index}".*?</article>', page, re.S)
    assert found, index
    return found.group(0)


def test_each_turn_shows_its_events_inline_with_who_could_see_them(server: ViewerServer) -> None:
    status, page, _ = get(f"{server.base_url}/d/{_q(IDS['ecp'])}")
    assert status == 200
    responder = _turn(page, 1)
    events = _EVENT.findall(responder)
    assert [(k, actor) for k, _, actor, _ in events] == [
        ("tool_call", "responder"), ("notice", "responder"), ("tool_result", "responder")]
    call = html.unescape(events[0][3])
    assert "lookup_order" in call and "seen by responder; hidden from client" in call
    assert '"order_id": "A-1001"' in call
    notice = html.unescape(events[1][3])
    assert "seen by responder, client" in notice
    assert "shown instead: [The agent is looking up your order]" in notice
    assert '"tracking": "TRK-99812"' in html.unescape(events[2][3])
    # The Client's own action, in its own turn, hidden from the Responder.
    [own_call, own_result] = _EVENT.findall(_turn(page, 2))
    assert own_call[2] == "client" and "check_bank_app" in own_call[3]
    assert "hidden from responder" in html.unescape(own_result[3])
    # The events come before the utterance they belong to.
    assert responder.index("lookup_order") < responder.index("Let me check.")
    assert 'id="reward">1.00' in page


def test_what_each_side_saw_holds_its_tool_messages_and_nothing_hidden(server: ViewerServer) -> None:
    base = f"{server.base_url}/d/{_q(IDS['ecp'])}/seen"
    _, responder, _ = get(f"{base}/1?fragment=1")
    text = html.unescape(responder)
    assert "calls lookup_order(" in text and "answers call_1" in text
    assert "after 1 tool step(s) this turn" in text
    _, client, _ = get(f"{base}/2?fragment=1")
    text = html.unescape(client)
    assert "[The agent is looking up your order]" in text
    assert "calls check_bank_app(" in text and "answers call_2" in text
    assert "TRK-99812" not in text and "lookup_order" not in text


def test_the_world_at_the_end_beside_the_gold_world(server: ViewerServer) -> None:
    _, good, _ = get(f"{server.base_url}/d/{_q(IDS['ecp'])}")
    assert "✓ The final world is the gold world" in good and 'id="world-diff"' not in good
    assert "1 change(s) from the initial world" in good
    _, bad, _ = get(f"{server.base_url}/d/{_q(IDS['concat'])}")
    assert "✗ The final world differs from the gold world in 1 place(s)." in bad
    diff = re.search(r'<table class="world-diff" id="world-diff">(.*?)</table>', bad, re.S)
    assert diff is not None
    cells = [html.unescape(c) for c in re.findall(r"<code>(.*?)</code>", diff.group(1))]
    assert cells == ["$.orders.A-1001.status", '"shipped"', '"reshipped"']


def test_a_run_without_tools_shows_no_events_or_world(tmp_path: Path) -> None:
    from spasm.dataset.synthetic import synthesize_run

    run = synthesize_run(tmp_path / "run", n_dialogues=2, n_personas=1)
    did = str(open_run(run).dialogues.dialogue_id.iloc[0])
    with ViewerServer(run) as srv:
        _, page, _ = get(f"{srv.base_url}/d/{_q(did)}")
    assert 'class="events"' not in page and 'id="world"' not in page and 'id="reward"' not in page


# -- a run the engine generated with tools --------------------------------------------------
SHOP = Path(__file__).resolve().parent.parent / "examples" / "shop"


def _client(body: dict[str, Any]) -> str:
    said = [m for m in body["messages"] if m["role"] == "assistant"]
    if not said:
        return "Hi, my kettle, order 4471, never arrived."
    if len(said) == 1:
        return "Yes, it is order 4471. Please cancel it."
    return "Thank you, goodbye."


@pytest.fixture(scope="module")
def shop_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import yaml

    tmp = tmp_path_factory.mktemp("shop")
    with TestServer(reply=_client) as srv:
        data = yaml.safe_load((SHOP / "config.yaml").read_text())
        data["backends"]["client"] = {"kind": "openai", "base_url": srv.base_url, "model": "m"}
        scenarios = yaml.safe_load((SHOP / "scenarios.yaml").read_text())["scenarios"]
        for s in scenarios:
            s["world"] = str(SHOP / "world.json")
        data.update(scenarios=scenarios, tools=[str(SHOP / "tools.py")],
                    conditions=["ecp", "concat"], trials=2)
        data["backends"]["agent"]["target"] = f"{SHOP / 'responder.py'}:respond"
        data["personas"] = {"n": 1}
        (tmp / "shop.json").write_text(json.dumps(data), encoding="utf-8")
        assert main(["generate", "--config", str(tmp / "shop.json"), "--out", str(tmp / "run"),
                     "--no-progress"]) == 0
    return tmp / "run"


@pytest.mark.e2e
def test_a_generated_tool_run_is_viewed_evaluated_and_exported(shop_run: Path, tmp_path: Path) -> None:
    run = open_run(shop_run)
    dialogues = run.dialogues
    assert len(dialogues) == 2 * 2 * 2 and sorted(set(dialogues.trial)) == [0, 1]
    assert dialogues.reward.notna().all()
    with ViewerServer(shop_run) as srv:
        for did in dialogues.dialogue_id:
            view = run.dialogue(str(did))
            status, page, _ = get(f"{srv.base_url}/d/{_q(str(did))}")
            assert status == 200
            assert len(_EVENT.findall(page)) == len(view.events) > 0
            assert 'id="world"' in page
            for i in range(len(view.turns)):
                _, fragment, _ = get(f"{srv.base_url}/d/{_q(str(did))}/seen/{i}?fragment=1")
                assert "✓ verified" in fragment
    # eval: pass^k over the rewards, payload_leak by condition.
    assert main(["eval", str(shop_run), "--no-progress"]) == 0
    metrics = json.loads((shop_run / "eval" / "metrics.json").read_text())
    r = metrics["reliability"]
    assert r["outcome"] == "reward" and r["trials"] == 2
    overall = {row["condition"]: row for row in r["rows"] if row["scenario_id"] == "all"}
    for condition, row in overall.items():
        rewards = dialogues[dialogues.condition == condition].reward
        assert row["pass_hat"][0]["unbiased"] == pytest.approx(float((rewards >= 1).mean()))
    assert {x["condition"] for x in metrics["payload_leak"]["rates"]} == {"all", "ecp", "concat"}
    # export: the Responder's calls with its tools' schemas, checked.
    out = tmp_path / "export"
    assert main(["export", str(shop_run), "--out", str(out), "--split", "1,0,0",
                 "--echoing", "keep", "--allow-qa", "all"]) == 0
    assert main(["export", "--check", str(out / "openai" / "train.jsonl")]) == 0
    records = [json.loads(x) for x in (out / "openai" / "train.jsonl").read_text().splitlines()]
    assert all({t["function"]["name"] for t in r["tools"]} <= {"find_order", "cancel_order", "refund"}
               for r in records)
    assert any("tool_calls" in m for r in records for m in r["messages"])
