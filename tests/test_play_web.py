"""The play pages of `spasm view` over real HTTP: a session against the OpenAI-compatible test
server, its protections, a second tab, a server restart mid-dialogue, and the run it leaves."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from spasm.dataset import open_run
from spasm.engine import Engine
from spasm.play.web import add_play_routes
from spasm.testing import TestServer
from spasm.viewer.server import ViewerServer
from tests.conftest import config_from, endpoint_config
from tests.test_viewer_http import get, post

pytestmark = pytest.mark.e2e  # whole runs, a server, subprocesses

ROOT = Path(__file__).resolve().parent.parent


def make_played_run(run: Path, base_url: str) -> Path:
    """A small finished run against the test server (the run a person then plays)."""
    config = config_from(endpoint_config(base_url, personas={"n": 2}))
    anyio.run(Engine(config, run, progress=False).run)
    return run


@pytest.fixture(scope="module")
def model() -> Iterator[TestServer]:
    with TestServer() as srv:
        yield srv


@pytest.fixture
def run_dir(tmp_path: Path, model: TestServer) -> Path:
    return make_played_run(tmp_path / "run", model.base_url)


def _csrf(base: str) -> str:
    status, page, _ = get(f"{base}/play")
    assert status == 200
    found = re.search(r'name="spasm-csrf" content="([^"]+)"', page)
    assert found is not None
    return found.group(1)


def wait_for(base: str, sid: str, ok: Callable[[dict[str, Any]], bool],
             limit_s: float = 120) -> dict[str, Any]:
    """Poll the session's state until ``ok`` (``limit_s``: only a guard against a hang)."""
    deadline = time.monotonic() + limit_s
    while True:
        code, body, _ = get(f"{base}/api/play/{sid}")
        if code == 200:
            state = json.loads(body)
            if ok(state):
                return state
            if state["status"] == "failed":
                raise AssertionError(state["detail"])
        if time.monotonic() > deadline:
            raise AssertionError(f"the session never got there: {body}")
        time.sleep(0.1)


def _turn_requests(model: TestServer) -> int:
    """The chat requests that wrote a dialogue's turn (not the start-up check's 1-token call)."""
    return sum(1 for r in model.requests if r.get("max_tokens") == 40)


def _turn(n: int) -> Callable[[dict[str, Any]], bool]:
    return lambda s: s["status"] == "your_turn" and s["turn"] == n


def test_a_session_in_the_browser_survives_a_second_tab_and_a_restart(run_dir: Path,
                                                                      model: TestServer) -> None:
    markup = "<img src=x onerror=alert(1)> my parcel is late"
    with ViewerServer(run_dir, extend=add_play_routes) as srv:
        base = srv.base_url
        csrf = _csrf(base)
        h = {"X-Spasm-CSRF": csrf}
        # Writes need the page's token and the viewer's own origin.
        assert post(f"{base}/api/play", {"seat": "client"})[0] == 403
        assert post(f"{base}/api/play", {"seat": "client"},
                    {**h, "Origin": "http://evil.example"})[0] == 403
        assert post(f"{base}/api/play", {"seat": "judge"}, h)[0] == 400
        code, made = post(f"{base}/api/play", {"seat": "client", "operator": "tester"}, h)
        assert code == 201, made
        sid = made["sid"]
        first = wait_for(base, sid, _turn(0))
        assert "You are " in first["frame"] and first["operator"] == "tester"
        code, state = post(f"{base}/api/play/{sid}/say",
                           {"turn": 0, "text": markup, "typing_ms": 4200, "edits": 3,
                            "pasted_chars": 0}, h)
        assert code == 200 and state["status"] in ("thinking", "your_turn")
        # A second tab answering the same turn is told, and nothing is taken twice.
        code, refused = post(f"{base}/api/play/{sid}/say", {"turn": 0, "text": "again"}, h)
        assert code == 409 and "already answered" in refused["error"]
        second = wait_for(base, sid, _turn(2))
        asked = _turn_requests(model)
        assert [m["side"] for m in second["messages"]] == ["note", "self", "other"]
        assert second["messages"][1]["text"] == markup  # as typed: JSON text, never markup
    # The server stops between two turns; a new one finds the session where it was.
    with ViewerServer(run_dir, extend=add_play_routes) as srv:
        base = srv.base_url
        again = wait_for(base, sid, _turn(2))
        assert again["messages"] == second["messages"]
        assert _turn_requests(model) == asked  # replayed from the cache: no model was asked
        h = {"X-Spasm-CSRF": _csrf(base)}
        assert h["X-Spasm-CSRF"] == csrf  # kept with the sessions: an open page still works
        code, _ = post(f"{base}/api/play/{sid}/say",
                       {"turn": 2, "text": "x" * 1_000_000, "typing_ms": 900, "edits": 0,
                        "pasted_chars": 1_000_000}, h)
        assert code == 200
        wait_for(base, sid, _turn(4))
        assert post(f"{base}/api/play/{sid}/end", {}, h)[0] == 200
        asked = wait_for(base, sid, lambda s: s["status"] == "debrief")
        assert asked["goal"] == "" and asked["messages"][-1]["side"] == "other"
        assert post(f"{base}/api/play/{sid}/debrief", {"goal_met": None, "rating": 9}, h)[0] == 400
        assert post(f"{base}/api/play/{sid}/debrief", {"goal_met": None, "rating": 2}, h)[0] == 200
        ended = wait_for(base, sid, lambda s: s["status"] == "ended")
        played = Path(ended["run"])
    run = open_run(played)
    (dialogue,) = run.table("dialogues").to_pylist()
    assert dialogue["termination_reason"] == "ended_by_person"
    assert dialogue["interface"] == "web" and dialogue["operator"] == "tester"
    assert dialogue["person_rating"] == 2 and dialogue["person_goal_met"] is None
    turns = sorted(run.table("turns").to_pylist(), key=lambda t: t["turn_index"])
    mine = [t for t in turns if t["speaker"] == "client"]
    assert [t["text"] for t in mine] == [markup, "x" * 1_000_000]
    assert [(t["typing_ms"], t["edits"], t["pasted_chars"]) for t in mine] == [
        (4200, 3, 0), (900, 0, 1_000_000)]
    # The restart replayed the model's first reply from the session's cache.
    calls = run.table("calls").to_pylist()
    assert any(c["cache_hit"] for c in calls if c["backend"] == "srv")
    assert played.parent.parent == run_dir.parent / "run.play"  # beside the run, not inside it
    with ViewerServer(played) as srv:  # a played run is a run like any other for the viewer
        assert get(f"{srv.base_url}/")[0] == 200
        code, shown, _ = get(f"{srv.base_url}/d/{dialogue['dialogue_id']}")
        assert code == 200 and "&lt;img src=x" in shown and "human×m" in shown


def test_play_pages_are_behind_the_viewers_host_check(run_dir: Path) -> None:
    with ViewerServer(run_dir, extend=add_play_routes) as srv:
        code, _, _ = get(f"{srv.base_url}/play", {"Host": "attacker.example"})
        assert code == 421
        code, _, headers = get(f"{srv.base_url}/play")
        assert code == 200 and "script-src 'self'" in headers["content-security-policy"]


def test_take_this_seat_from_turn_t_keeps_the_prefix_and_says_where_it_began(run_dir: Path) -> None:
    original = open_run(run_dir)
    did = sorted(original.table("dialogues", ["dialogue_id"]).column(0).to_pylist())[0]
    before = sorted((t for t in original.table("turns").to_pylist() if t["dialogue_id"] == did),
                    key=lambda t: t["turn_index"])
    with ViewerServer(run_dir, extend=add_play_routes) as srv:
        base = srv.base_url
        _, page, _ = get(f"{base}/d/{did}")
        assert f'href="/play/fork/{did}/2"' in page  # the dialogue page offers every turn
        code, offer, _ = get(f"{base}/play/fork/{did}/2")
        assert code == 200 and "Take the client's seat from turn 2" in offer
        h = {"X-Spasm-CSRF": _csrf(base)}
        assert post(f"{base}/api/play", {"fork": {"dialogue_id": did, "turn": 99}}, h)[0] == 400
        code, made = post(f"{base}/api/play", {"fork": {"dialogue_id": did, "turn": 2}}, h)
        assert code == 201, made
        sid = made["sid"]
        state = wait_for(base, sid, _turn(2))
        # The seat sees the original's first two turns, word for word.
        assert [m["text"] for m in state["messages"][1:]] == [t["text"] for t in before[:2]]
        assert post(f"{base}/api/play/{sid}/say", {"turn": 2, "text": "Actually, I changed my mind."},
                    h)[0] == 200
        wait_for(base, sid, _turn(4))
        post(f"{base}/api/play/{sid}/end", {}, h)
        wait_for(base, sid, lambda s: s["status"] == "debrief")
        post(f"{base}/api/play/{sid}/debrief", {}, h)
        ended = wait_for(base, sid, lambda s: s["status"] == "ended")
    run = open_run(Path(ended["run"]))
    (dialogue,) = run.table("dialogues").to_pylist()
    assert dialogue["forked_from"] == did and dialogue["forked_at"] == 2
    assert dialogue["persona_id"] == before[0]["dialogue_id"].split("-k")[0]
    turns = sorted(run.table("turns").to_pylist(), key=lambda t: t["turn_index"])
    assert [t["text"] for t in turns[:2]] == [t["text"] for t in before[:2]]
    assert turns[2]["text"] == "Actually, I changed my mind." and turns[2]["speaker"] == "client"
    assert turns[3]["speaker"] == "responder" and turns[3]["text"] != before[3]["text"]


def _serve(run_dir: Path, port: int) -> subprocess.Popen[bytes]:
    """`spasm view RUN` as a person starts it (the play pages come from spasm.cli)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "spasm", "view", str(run_dir), "--port", str(port),
                             "--no-browser"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while get_or_none(f"http://127.0.0.1:{port}/play") is None:
        assert proc.poll() is None and time.monotonic() < deadline, "spasm view did not start"
        time.sleep(0.2)
    return proc


def get_or_none(url: str) -> str | None:
    try:
        code, body, _ = get(url)
    except OSError:
        return None
    return body if code == 200 else None


def test_a_kill_9_of_spasm_view_between_two_turns_loses_nothing_said(run_dir: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    proc = _serve(run_dir, port)
    try:
        h = {"X-Spasm-CSRF": _csrf(base)}
        code, made = post(f"{base}/api/play", {"seat": "client"}, h)
        assert code == 201, made
        sid = made["sid"]
        wait_for(base, sid, _turn(0))
        assert post(f"{base}/api/play/{sid}/say", {"turn": 0, "text": "First line."}, h)[0] == 200
        before = wait_for(base, sid, _turn(2))
        assert post(f"{base}/api/play/{sid}/say", {"turn": 2, "text": "Second line."}, h)[0] == 200
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # right after the second line: mid-turn
        proc.wait()
    proc = _serve(run_dir, port)
    try:
        after = wait_for(base, sid, _turn(4))  # both lines kept, the dialogue went on
        assert [m["text"] for m in after["messages"][:3]] == [m["text"] for m in before["messages"]]
        assert after["messages"][3]["text"] == "Second line."
        assert post(f"{base}/api/play/{sid}/end", {}, h)[0] == 200
        wait_for(base, sid, lambda s: s["status"] == "debrief")
        post(f"{base}/api/play/{sid}/debrief", {"rating": 4}, h)
        ended = wait_for(base, sid, lambda s: s["status"] == "ended")
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait()
    run = open_run(Path(ended["run"]))
    texts = [t["text"] for t in sorted(run.table("turns").to_pylist(), key=lambda t: t["turn_index"])
             if t["speaker"] == "client"]
    assert texts == ["First line.", "Second line."]
