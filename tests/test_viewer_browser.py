"""`spasm view` in a real headless Chromium (Debian's package, driven by Playwright).

Skipped when /usr/bin/chromium is missing; `.ci/run` installs it. Set SPASM_SCREENSHOTS=DIR to
keep the screenshots (README's come from here: ``SPASM_SCREENSHOTS=docs/img``).
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.parse
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.test_viewer_http import ECHO, INJECTION, make_run

pytestmark = pytest.mark.e2e

CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.exists():
    pytest.skip("Chromium is not installed (apt-get install chromium; .ci/run does it)",
                allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is in the dev extra")

from spasm.dataset import open_run  # noqa: E402
from spasm.viewer.server import ViewerServer  # noqa: E402

T = TypeVar("T")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def _in_thread(fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn`` in a worker thread: Playwright's sync API keeps an event loop running in this
    one, and the engine and ``spasm eval`` start their own."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn, *args).result()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _in_thread(make_run, tmp_path_factory.mktemp("browser") / "run")


@pytest.fixture(scope="module")
def server(run_dir: Path) -> Iterator[ViewerServer]:
    with ViewerServer(run_dir) as srv:
        yield srv


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    yield pg
    context.close()
    assert errors == []  # no script error on any page


def _shot(page: Any, name: str, tmp_path: Path) -> None:
    folder = Path(os.environ.get("SPASM_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / name), full_page=True)


def _dialogues(run_dir: Path) -> Any:
    return open_run(run_dir).dialogues.set_index("dialogue_id")


def _pick(run_dir: Path, condition: str, level: str) -> str:
    d = _dialogues(run_dir)
    return str(sorted(d[(d.condition == condition) & (d.harness_level == level)].index)[0])


def _url(server: ViewerServer, path: str, dialogue_id: str = "") -> str:
    return server.base_url + path + urllib.parse.quote(dialogue_id, safe="")


def test_the_overview_and_a_filtered_searched_list(page: Any, server: ViewerServer, run_dir: Path) -> None:
    d = _dialogues(run_dir)
    page.goto(server.base_url + "/")
    assert page.text_content("#count-dialogues") == str(len(d))
    assert "max_turns" in page.text_content("body") or "natural_rule" in page.text_content("body")
    page.click("text=Dialogues")
    page.select_option("select[name=condition]", "concat")  # applies at once
    page.wait_for_url("**/dialogues?condition=concat")
    assert page.text_content("#total") == str((d.condition == "concat").sum())
    assert page.locator("#dialogue-table tbody tr").count() == (d.condition == "concat").sum()
    page.fill("#search", "anything else I can help")
    page.press("#search", "Enter")
    page.wait_for_url("**q=anything*")
    turns = open_run(run_dir).turns
    hits = turns[turns.text.str.contains("anything else I can help", regex=False)]
    expected = d.loc[hits.dialogue_id.unique()]
    assert page.text_content("#total") == str((expected.condition == "concat").sum())
    assert "anything else I can help" in page.text_content("#dialogue-table")


def test_planted_script_and_onerror_show_as_text_and_never_run(
    page: Any, server: ViewerServer, run_dir: Path
) -> None:
    did = _pick(run_dir, "ecp", "A")
    page.goto(_url(server, "/d/", did))
    title = page.title()
    assert "pwned" not in title and did in title
    chat = page.text_content("#chat")
    assert "<script>document.title='pwned'</script>" in chat and 'onerror="document.title' in chat
    assert page.evaluate("document.querySelectorAll('main script, main img, [onerror]').length") == 0
    # The same text inside "what the agent saw" (the next Client turn was sent it).
    page.click("#turn-6 button.seen-btn")
    page.wait_for_selector("#seen-6 .seen")
    assert INJECTION in page.text_content("#seen-6")
    assert page.evaluate("document.querySelectorAll('#seen-6 script, #seen-6 img').length") == 0
    assert page.title() == title


def test_what_each_agent_saw_is_shown_verified_and_the_card_is_marked(
    page: Any, server: ViewerServer, run_dir: Path
) -> None:
    did = _pick(run_dir, "ecp", "A")
    view = open_run(run_dir).dialogue(did)
    page.goto(_url(server, "/d/", did))
    assert "never shown to the responder" in page.text_content("#persona-card").lower()
    assert "the card is in none of the messages the Responder was sent" in page.text_content("#card-check")
    page.click("#turn-3 button.seen-btn")
    panel = page.wait_for_selector("#seen-3 .seen")
    assert panel.get_attribute("data-verified") == "true"
    assert "✓ verified" in panel.text_content()
    roles = [r.text_content() for r in page.query_selector_all("#seen-3 .msg .role")]
    assert roles == [m["role"] for m in view.seen(3).messages] == ["system", "user", "assistant", "user"]
    contents = [c.text_content() for c in page.query_selector_all("#seen-3 .msg pre")]
    assert contents[1] == view.turns[0]["text"] and contents[2] == view.turns[1]["text"]
    assert view.persona is not None and view.persona["card"] not in " ".join(contents)


def test_side_by_side_aligns_conditions_and_levels_by_turn(
    page: Any, server: ViewerServer, run_dir: Path, tmp_path: Path
) -> None:
    did = _pick(run_dir, "ecp", "A")
    page.goto(_url(server, "/d/", did))
    page.click("#compare-link")
    page.wait_for_selector("#compare-grid")
    heads = [h.text_content() or "" for h in page.query_selector_all(".cell.head a")]
    assert [" ".join(h.split()) for h in heads] == ["ECP · level A", "CONCAT · level A",
                                                      "ECP · level E", "CONCAT · level E"]
    row4 = page.query_selector_all(".row[data-turn='4'] .cell")
    assert len(row4) == 4
    texts = [c.text_content() or "" for c in row4]
    assert ECHO in texts[1] and ECHO not in texts[0]  # CONCAT's Client echoes; ECP's does not
    _shot(page, "viewer-side-by-side.png", tmp_path)
    page.uncheck("input[data-level=E]")
    page.click("#apply-levels")
    page.wait_for_url("**levels=A")
    assert page.locator(".cell.head").count() == 2


def test_the_harness_state_is_charted_with_checks_and_rewrites(
    page: Any, server: ViewerServer, run_dir: Path
) -> None:
    did = _pick(run_dir, "concat", "E")
    page.goto(_url(server, "/d/", did))
    assert page.locator("#harness svg polyline").count() >= 8 + 4  # emotions and relation at least
    assert "Emotions (Plutchik, 0-100)" in page.text_content("#harness")
    # The Client's echoing draft failed the check and was rewritten; both checks are listed.
    row = page.locator("#harness tr.rewritten[data-turn='4']")
    assert row.locator(".check.fail").count() == 1 and row.locator(".check.pass").count() == 1
    assert "gives advice or offers help" in (row.text_content() or "")
    assert page.locator("#turn-4 .pill", has_text="rewritten").count() == 1
    assert ECHO not in (page.text_content("#turn-4") or "")  # the accepted text is the rewrite


def _label(page: Any, keys: list[str]) -> None:
    for key in keys:
        page.keyboard.press(key)


def test_two_annotators_label_with_keys_and_eval_reports_kappa(
    browser: Any, run_dir: Path, tmp_path: Path
) -> None:
    from spasm.cli import main

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    first, second = sorted(_dialogues(copy).query("condition == 'concat'").index)[:2]
    with ViewerServer(copy) as srv:
        for name in ("ana", "ben"):
            context = browser.new_context(viewport={"width": 1360, "height": 1000})
            page = context.new_page()
            page.goto(srv.base_url + "/dialogues?condition=concat")
            page.fill("#annotator", name)
            page.press("#annotator", "Escape")
            page.click(f"a.open >> text={first}")
            page.wait_for_selector("#label-form[data-ready]")
            _label(page, ["2", "f", "s"])  # echoing by the client, role flip, save
            page.wait_for_selector("#label-status.ok")
            _label(page, ["Enter"])  # save again and go to the next dialogue
            page.wait_for_url(f"**/d/{urllib.parse.quote(second, safe='')}?*")
            page.wait_for_selector("#label-form[data-ready]")
            _label(page, ["1", "s"])  # no echoing, save
            page.wait_for_selector("#label-status.ok")
            context.close()
        page = browser.new_context(viewport={"width": 1360, "height": 1000}).new_page()
        page.goto(_url(srv, "/d/", first))
        page.wait_for_selector("#labels-table tr[data-annotator=ben]")
        rows = [r.text_content() for r in page.query_selector_all("#labels-table tbody tr")]
        assert len(rows) == 2 and all("client" in r and "yes" in r for r in rows)
        assert "4 labels in total" in page.text_content("#labels-history")

        assert _in_thread(main, ["eval", str(copy), "--no-progress"]) == 0
        metrics = json.loads((copy / "eval" / "metrics.json").read_text())
        note = metrics["echoing"]["human_note"]
        assert "2 annotator(s) (ana, ben)" in note and "6 labels, 2 superseded" in note
        assert "between annotators Cohen's κ = 1.00 (echoing label)" in note
        assert "people (majority) vs rule" in note
        srv.app.state.viewer.index.snapshot(force=True)
        page.goto(srv.base_url + "/")
        assert "Cohen's κ = 1.00" in page.text_content("#agreement")
        page.goto(_url(srv, "/d/", first))
        page.fill("#annotator", "ana")
        page.press("#annotator", "Escape")
        page.click("#turn-6 button.seen-btn")
        page.wait_for_selector("#seen-6 .seen")
        _shot(page, "viewer-dialogue.png", tmp_path)


def test_a_group_dialogue_shows_a_colour_per_participant_and_what_each_saw(
    browser: Any, tmp_path: Path
) -> None:
    from tests.test_viewer_group import _make_group_run

    group_run = _in_thread(_make_group_run, tmp_path / "group")
    view = open_run(group_run).dialogue("g0000-ecp")
    with ViewerServer(group_run) as srv:
        context = browser.new_context(viewport={"width": 1360, "height": 1000})
        page = context.new_page()
        page.goto(srv.base_url + "/d/g0000-ecp")
        assert page.locator("#participants tr.seat-row").count() == 4
        speakers = [b.text_content() for b in page.query_selector_all("#chat article .speaker")]
        assert speakers == [t["speaker"] for t in view.turns]
        backgrounds = page.evaluate(
            "Array.from(document.querySelectorAll('#chat article.turn'))"
            ".map((a) => getComputedStyle(a).backgroundColor)")
        assert len(set(backgrounds)) == 4  # one tint per participant, the same on each turn
        page.click("#turn-3 button.seen-btn")
        panel = page.wait_for_selector("#seen-3 .seen")
        assert panel.get_attribute("data-verified") == "true"
        roles = [r.text_content() for r in page.query_selector_all("#seen-3 .msg .role")]
        assert roles == [m["role"] for m in view.seen(3).messages]
        _shot(page, "viewer-group.png", tmp_path)
        context.close()
