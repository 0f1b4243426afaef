"""The play page in a real headless Chromium (Debian's package, driven by Playwright): a person
starts a session, sees the other side thinking, types markup that stays text, reloads, ends it.

Skipped when /usr/bin/chromium is missing; `.ci/run` installs it. SPASM_SCREENSHOTS=DIR keeps
the screenshot (the README's: ``SPASM_SCREENSHOTS=docs/img``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.test_viewer_browser import ARGS, CHROMIUM, _in_thread

pytestmark = pytest.mark.e2e  # whole runs, a server, subprocesses

sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is in the dev extra")

from spasm.dataset import open_run  # noqa: E402
from spasm.play.web import add_play_routes  # noqa: E402
from spasm.testing import FaultPlan, TestServer  # noqa: E402
from spasm.viewer.server import ViewerServer  # noqa: E402
from tests.test_play_web import make_played_run  # noqa: E402

MARKUP = '<img src=x onerror="document.title=\'pwned\'"><b>not bold</b> my parcel is late'


@pytest.fixture(scope="module")
def model() -> Iterator[TestServer]:
    # Each reply takes a while, so the page's "thinking" state is there to be seen.
    with TestServer(FaultPlan(latency_s=1.5, seed=1)) as srv:
        yield srv


@pytest.fixture
def page() -> Iterator[Any]:
    assert CHROMIUM.exists()
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        context = browser.new_context(viewport={"width": 1200, "height": 900})
        pg = context.new_page()
        errors: list[str] = []
        pg.on("pageerror", lambda exc: errors.append(str(exc)))
        try:
            yield pg
        finally:
            browser.close()
        assert errors == []


def _status(page: Any, status: str) -> None:
    page.wait_for_selector(f'#play-status[data-status="{status}"]', timeout=120_000)


def test_a_person_plays_the_client_seat_in_chromium(tmp_path: Path, model: TestServer,
                                                    page: Any) -> None:
    run_dir = _in_thread(make_played_run, tmp_path / "run", model.base_url)
    with ViewerServer(run_dir, extend=add_play_routes) as srv:
        page.goto(f"{srv.base_url}/play")
        page.select_option('select[name="seat"]', "client")
        page.fill('input[name="operator"]', "browser-tester")
        page.click("#play-start")
        page.wait_for_url("**/play/s*")
        _status(page, "your_turn")
        assert "You are " in page.inner_text("#play-frame")
        page.fill("#play-text", MARKUP)
        page.press("#play-text", "Enter")
        _status(page, "thinking")  # the simulated side is answering
        assert "thinking" in page.inner_text("#play-status")
        _status(page, "your_turn")
        mine = page.locator("#play-log li.self .text")
        assert mine.first.inner_text() == MARKUP  # shown as text
        assert page.locator("#play-log img, #play-log b").count() == 0  # never as markup
        assert page.title() != "pwned"
        replies = page.locator("#play-log li.other").count()
        assert replies == 1
        # A refresh comes back to the same conversation, waiting for the same turn.
        page.reload()
        _status(page, "your_turn")
        assert page.locator("#play-log li.self .text").first.inner_text() == MARKUP
        assert page.locator("#play-log li.other").count() == replies
        folder = Path(os.environ.get("SPASM_SCREENSHOTS") or tmp_path)
        folder.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(folder / "play-page.png"), full_page=True)
        page.click("#play-end")
        _status(page, "debrief")  # asked for a verdict before it is saved
        page.select_option('select[name="rating"]', "4")
        page.click("#play-debrief-send")
        _status(page, "ended")
        sid = page.url.rsplit("/", 1)[-1]
    run = open_run(run_dir.parent / "run.play" / sid / "run")
    (dialogue,) = run.table("dialogues").to_pylist()
    assert dialogue["termination_reason"] == "ended_by_person"
    assert dialogue["interface"] == "web" and dialogue["operator"] == "browser-tester"
    assert dialogue["person_rating"] == 4
    (first,) = [t for t in run.table("turns").to_pylist() if t["speaker"] == "client"]
    assert first["text"] == MARKUP
    # The page measured the typing: a fill is no keystroke deletion and no paste.
    assert first["typing_ms"] is not None and first["typing_ms"] > 0
    assert first["edits"] == 0 and first["pasted_chars"] == 0


def test_a_person_silent_for_an_hour_finds_the_dialogue_where_it_was(tmp_path: Path,
                                                                     model: TestServer,
                                                                     page: Any) -> None:
    """Nothing waits on the browser: an hour without a line (the page's clock jumped ahead, so
    every timer it has fires and performance.now() moves on) leaves the dialogue waiting for the
    same turn, asks no model anything, and the line typed after it is taken and answered; the
    hour is in the turn's typing_ms."""
    run_dir = _in_thread(make_played_run, tmp_path / "run", model.base_url)
    page.clock.install()
    with ViewerServer(run_dir, extend=add_play_routes) as srv:
        page.goto(f"{srv.base_url}/play")
        page.select_option('select[name="seat"]', "client")
        page.click("#play-start")
        page.wait_for_url("**/play/s*")
        _status(page, "your_turn")
        asked = len(model.requests)
        page.clock.fast_forward("01:00:00")
        page.clock.run_for(2_000)  # the page's poll, after the jump
        _status(page, "your_turn")
        assert len(model.requests) == asked  # the silence asked no model anything
        assert page.locator("#play-log li.self").count() == 0
        page.fill("#play-text", "sorry, I was away: my parcel is still late")
        page.press("#play-text", "Enter")
        page.wait_for_selector("#play-log li.other", timeout=120_000)  # the dialogue resumed
        _status(page, "your_turn")
        page.click("#play-end")
        _status(page, "debrief")
        page.click("#play-debrief-send")
        _status(page, "ended")
        sid = page.url.rsplit("/", 1)[-1]
    run = open_run(run_dir.parent / "run.play" / sid / "run")
    (first,) = [t for t in run.table("turns").to_pylist() if t["speaker"] == "client"]
    assert first["text"] == "sorry, I was away: my parcel is still late"
    assert first["typing_ms"] is not None and first["typing_ms"] >= 3_600_000
