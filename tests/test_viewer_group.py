"""`spasm view` of a group dialogue, over HTTP against a real uvicorn server on
127.0.0.1 serving a four-participant run generated through the engine and the test server: the
participants listed, each message with its speaker's id and colour, why it spoke, and what
each participant saw for any turn, rebuilt and verified against the stored digest."""

from __future__ import annotations

import html
import re
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import anyio
import pandas as pd
import pytest

pytest.importorskip("fastapi", reason="the viewer needs the 'view' extra: pip install 'spasm[view]'")
pytest.importorskip("duckdb", reason="the viewer needs the 'view' extra: pip install 'spasm[view]'")

from spasm.config import parse_config
from spasm.dataset import open_run
from spasm.engine import Engine
from spasm.testing import TestServer
from spasm.viewer.pages import SEAT_COLOURS
from spasm.viewer.server import ViewerServer
from tests.test_group import IDS, _group_data
from tests.test_viewer_http import get

pytestmark = pytest.mark.e2e

CSS = Path(__file__).resolve().parents[1] / "spasm" / "viewer" / "static" / "viewer.css"
_ARTICLE = re.compile(r'<article class="turn ([^"]*)" id="turn-(\d+)" data-turn="\d+"'
                      r'(?: data-speaker="([^"]*)")?>(.*?)</article>', re.S)


def _make_group_run(run_dir: Path) -> Path:
    """One group of three client seats and a facilitator, ECP and CONCAT, round robin."""
    with TestServer() as srv:
        data = _group_data(srv.base_url, next_speaker="round_robin")
        data["personas"] = {"n": 3}
        config = parse_config(data, "<test>")
        summary = anyio.run(Engine(config, run_dir, progress=False, sleep_scale=0).run)
    assert summary.completed == summary.planned == 2, summary.line()
    return run_dir


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _make_group_run(tmp_path_factory.mktemp("group-view") / "run")


@pytest.fixture(scope="module")
def server(run_dir: Path) -> Iterator[ViewerServer]:
    with ViewerServer(run_dir) as srv:
        yield srv


def _q(dialogue_id: str) -> str:
    return urllib.parse.quote(dialogue_id, safe="")


def test_the_page_lists_the_participants_with_role_persona_backend_and_model(
    server: ViewerServer, run_dir: Path,
) -> None:
    seats = pd.read_parquet(run_dir / "participants.parquet")
    for did, rows in seats.groupby("dialogue_id"):
        status, page, _ = get(f"{server.base_url}/d/{_q(str(did))}")
        assert status == 200
        section = page.split('<section class="participants" id="participants">', 1)[1].split(
            "</section>", 1)[0]
        listed = re.findall(r'<tr class="seat-row seat-(\d+)" data-participant="([^"]+)">(.*?)</tr>',
                            section, re.S)
        assert [p for _, p, _ in listed] == list(IDS)  # all four, in seat order
        for (colour, pid, cells), (_, seat) in zip(listed, rows.sort_values("position").iterrows(),
                                                    strict=True):
            assert pid == seat.participant_id and int(colour) == seat.position % SEAT_COLOURS
            texts = [html.unescape(re.sub(r"<[^>]+>", "", c)) for c in re.findall(
                r"<td[^>]*>(.*?)</td>", cells, re.S)]
            persona = seat.persona_id if isinstance(seat.persona_id, str) else "–"
            assert texts[1:4] == [seat.role, persona, f"{seat.backend} · {seat.model}"]
        assert 'id="n-participants">4 (3 client, 1 responder)' in page
        # The card shown is the first client seat's, and its owner is named.
        first = rows[rows.role == "client"].sort_values("position").iloc[0]
        assert f"Persona card of {first.participant_id} " in page


def test_each_message_carries_its_speaker_id_colour_and_why_it_spoke(
    server: ViewerServer, run_dir: Path,
) -> None:
    turns = pd.read_parquet(run_dir / "turns.parquet")
    seats = pd.read_parquet(run_dir / "participants.parquet")
    for did, expected in turns.sort_values("turn_index").groupby("dialogue_id"):
        colour = {str(r.participant_id): int(str(r.position)) % SEAT_COLOURS
                  for r in seats[seats.dialogue_id == did].itertuples()}
        _, page, _ = get(f"{server.base_url}/d/{_q(str(did))}")
        articles = _ARTICLE.findall(page)
        assert len(articles) == len(expected) == 8
        for (classes, index, speaker, body), turn in zip(articles, expected.itertuples(), strict=True):
            assert int(index) == turn.turn_index and speaker == turn.speaker
            assert classes.split()[:3] == ["seat", f"seat-{colour[speaker]}", turn.role]
            assert f'<b class="speaker">{speaker}</b>' in body
            why = f'<small class="reason" title="why the turn order chose {speaker}">'
            assert f"{why}{turn.next_speaker_reason!s}</small>" in body
            assert f"What {speaker} saw (" in body and "✓ verified" in body
        assert len(set(colour.values())) == 4  # a colour per participant
        assert 'id="reason-summary">opener ×1 · round robin ×7</td>' in page


def test_what_each_participant_saw_is_the_frame_that_verifies(server: ViewerServer, run_dir: Path) -> None:
    reader = open_run(run_dir)
    for did in pd.read_parquet(run_dir / "dialogues.parquet").dialogue_id:
        view = reader.dialogue(str(did))
        assert len(view.participants) == 4
        for i, turn in enumerate(view.turns):
            _, fragment, _ = get(f"{server.base_url}/d/{_q(str(did))}/seen/{turn['turn_index']}?fragment=1")
            assert 'data-verified="true"' in fragment and "✓ verified" in fragment
            assert f"sent to {turn['speaker']} (" in fragment
            shown = [(role, html.unescape(text)) for role, text in re.findall(
                r'<li class="msg role-(\w+)"><span class="role">\w+</span><pre>(.*?)</pre></li>',
                fragment, re.S)]
            seen = view.seen(i)
            assert seen.verified is True
            assert shown == [(m["role"], str(m.get("content") or "")) for m in seen.messages]
            # The frame is this participant's: it is told it appears as itself.
            assert f"You appear in it as {turn['speaker']}" in shown[0][1]
    status, page, _ = get(f"{server.base_url}/d/g0000-ecp/seen/3")
    assert status == 200 and "<h1>What Facilitator saw before utterance 3</h1>" in page


def test_a_group_run_changed_after_generation_shows_the_failed_check(tmp_path: Path, run_dir: Path) -> None:
    """A copy written through the run store (a group run: its turns have the group columns)
    with Ana's opening line edited, as a redaction pass would: later digests no longer match."""
    from spasm.dataset.store import RunStore
    from spasm.personas.schema import load_schema

    run = open_run(run_dir)
    tables = {t: run.table(t).to_pylist() for t in ("personas", "dialogues", "turns", "participants")}
    for turn in tables["turns"]:
        if turn["dialogue_id"] == "g0000-ecp" and turn["turn_index"] == 0:
            turn["text"] = "edited after the run"
    schema = load_schema(None)
    store = RunStore(tmp_path / "edited")
    store.create()
    store.set_persona_fields(schema.field_names, schema.integer_fields())
    store.declare_group()
    store.write_batch("000001", tables)
    store.compact_all()
    store.write_json("manifest.json", dict(run.manifest))
    with ViewerServer(tmp_path / "edited") as srv:
        _, first, _ = get(f"{srv.base_url}/d/g0000-ecp/seen/0?fragment=1")
        _, later, _ = get(f"{srv.base_url}/d/g0000-ecp/seen/2?fragment=1")
        _, page, _ = get(f"{srv.base_url}/d/g0000-ecp")
    assert 'data-verified="true"' in first  # the turn before the edit still verifies
    assert 'data-verified="false"' in later and "does not hash to the stored digest" in later
    assert "✗ digest mismatch" in page and "edited after the run" in page


def test_the_list_and_side_by_side_show_group_dialogues(server: ViewerServer) -> None:
    _, page, _ = get(server.base_url + "/dialogues")
    assert '<th title="participants in the group dialogue">participants</th>' in page
    rows = re.findall(r'<tr data-dialogue="([^"]+)">.*?<td class="num participants">(\d*)</td>', page, re.S)
    assert sorted(rows) == [("g0000-concat", "4"), ("g0000-ecp", "4")]
    status, grid, _ = get(server.base_url + "/compare/g0000-ecp")
    assert status == 200
    cells = re.findall(r'<div class="cell turn seat seat-(\d) (client|responder)">\s*<header>'
                       r'<b class="speaker">(\w+)</b>', grid)
    assert len(cells) == 16 and {c[2] for c in cells} == set(IDS)


def _luminance(hex_colour: str) -> float:
    channels = [int(hex_colour[k:k + 2], 16) / 255 for k in (1, 3, 5)]
    lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def _contrast(a: str, b: str) -> float:
    hi, lo = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_participant_colours_have_accessible_contrast() -> None:
    """WCAG 2.1: text at least 4.5:1 against its background (the page's text, the speaker's id
    and the quiet reason on each tint), the seat's bar at least 3:1 (a non-text mark)."""
    css = CSS.read_text()
    fg = re.search(r"--fg: (#[0-9a-f]{6})", css)
    quiet = re.search(r"\.turn \.reason \{ color: (#[0-9a-f]{6})", css)
    assert fg and quiet
    seats = re.findall(r"\.seat-(\d) \{ --seat-bg: (#[0-9a-f]{6}); --seat-ink: (#[0-9a-f]{6}); "
                       r"--seat-line: (#[0-9a-f]{6}); \}", css)
    assert [int(s[0]) for s in seats] == list(range(SEAT_COLOURS))
    for _, bg, ink, line in seats:
        assert _contrast(fg.group(1), bg) >= 4.5
        assert _contrast(ink, bg) >= 4.5 and _contrast(ink, "#ffffff") >= 4.5
        assert _contrast(quiet.group(1), bg) >= 4.5
        assert _contrast(line, bg) >= 3.0
    assert len({s[1] for s in seats}) == SEAT_COLOURS  # eight distinct tints
