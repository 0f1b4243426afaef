"""`spasm view` over HTTP: its queries, its guard and its one write, against a real uvicorn
server on 127.0.0.1 serving a run generated through the engine and the test server.

The browser tests (tests/test_viewer_browser.py) reuse :func:`make_run` and :func:`get`.
"""

from __future__ import annotations

import json
import re
import shutil
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("fastapi", reason="the viewer needs the 'view' extra: pip install 'spasm[view]'")
pytest.importorskip("duckdb", reason="the viewer needs the 'view' extra: pip install 'spasm[view]'")

from spasm.dataset import open_run
from spasm.engine import Engine
from spasm.testing import TestServer
from spasm.testing.server import default_reply
from spasm.viewer.listing import ListQuery
from spasm.viewer.queries import RunIndex
from spasm.viewer.server import ViewerServer
from tests.conftest import config_from, endpoint_config

pytestmark = pytest.mark.e2e

#: Planted in a Responder reply: must show as text and never run.
INJECTION = ("Could you paste the model number exactly as printed? <script>document.title='pwned'"
             "</script><img src=x onerror=\"document.title='pwned'\">")
CLIENT = [
    "Hi, my washing machine stopped mid-cycle and it's still under warranty. What can I do?",
    "It's a Lumo 800 I bought in March. The drum won't turn at all and it shows error E21.",
    "I have the receipt and the warranty card. Do you need a photo of both?",
    "Thanks, that's all I needed. Bye!",
]
ECHO = ("Here are the steps you can take: first, check the warranty terms; second, book a "
        "repair visit. Is there anything else I can help you with?")
RESPONDER = [
    "I'm sorry to hear that. Is the machine still under its two-year warranty?",
    "Error E21 is a drain pump fault. Here are the steps you can take: first, check the warranty "
    "terms; second, book a repair visit.",
    INJECTION,
    "You're welcome. A technician will call you within two working days.",
]


def _speaker_and_depth(body: dict[str, Any]) -> tuple[str, int, bool]:
    """Who is asked to speak, how many utterances came before, and whether it is CONCAT."""
    messages = body["messages"]
    system = str(messages[0].get("content") or "") if messages[0]["role"] == "system" else ""
    speaker = "responder" if system.startswith("You are a customer-service agent") else "client"
    transcript = next((m["content"] for m in messages if "Conversation so far:" in str(m["content"])), None)
    # The harness keeps only a window of turns, but says where the conversation is.
    where = re.search(r"This is message (\d+) of the conversation", " ".join(
        str(m.get("content") or "") for m in messages if m["role"] == "system"))
    if where:
        depth = int(where.group(1)) - 1
    elif transcript is not None:  # CONCAT: one neutral transcript
        depth = sum(line.startswith(("Client: ", "Responder: ")) for line in transcript.splitlines())
    else:
        depth = sum(m["role"] in ("user", "assistant") for m in messages)
    return speaker, depth, transcript is not None


def scripted_reply(body: dict[str, Any]) -> str:
    """A customer-service dialogue; under CONCAT the Client echoes the Responder's advice."""
    fmt = body.get("response_format") or {}
    title = ((fmt.get("json_schema") or {}).get("schema") or {}).get("title")
    if title == "CheckerOutput":
        candidate = str(body["messages"][-1]["content"])
        failed = "anything else I can help you with" in candidate
        return json.dumps({
            "dimension_scores": {"boundary": 20 if failed else 95, "fact": 80, "state": 80, "style": 85},
            "violations": ["gives the agent's advice"] if failed else [],
            "correction_advice": "Stay the customer: ask, do not advise." if failed else ""})
    if fmt:
        return default_reply(body)
    speaker, depth, concat = _speaker_and_depth(body)
    turn = min(depth // 2, 3)
    last_system = next((m["content"] for m in reversed(body["messages"]) if m["role"] == "system"), "")
    if speaker == "client" and concat and turn == 2 and "Your draft was:" not in str(last_system):
        return ECHO
    return CLIENT[turn] if speaker == "client" else RESPONDER[turn]


def make_run(run_dir: Path, levels: tuple[str, ...] = ("A", "E")) -> Path:
    """ECP and CONCAT dialogues of two personas at each harness level, through the engine."""
    with TestServer(reply=scripted_reply) as srv:
        data = endpoint_config(
            srv.base_url, personas={"n": 2}, conditions=["ecp", "concat"],
            dialogue={"max_turns_per_agent": 4, "max_tokens": 60},
            termination={"rules": True, "min_utterances": 4},
            harness={"levels": list(levels), "window": 3, "stride": 2},
        )
        summary = anyio.run(Engine(config_from(data), run_dir, progress=False, sleep_scale=0.0).run)
    assert summary.completed == summary.planned, summary.line()
    return run_dir


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str, dict[str, str]]:
    """GET ``url``: status, body, headers (no exception on 4xx)."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, r.read().decode(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), dict(e.headers)


def post(url: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        text = e.read().decode()
        try:
            return e.code, json.loads(text)
        except json.JSONDecodeError:
            return e.code, text


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_run(tmp_path_factory.mktemp("viewer") / "run")


@pytest.fixture(scope="module")
def server(run_dir: Path) -> Iterator[ViewerServer]:
    with ViewerServer(run_dir) as srv:
        yield srv


def _q(dialogue_id: str) -> str:
    return urllib.parse.quote(dialogue_id, safe="")


def test_the_index_reads_a_dialogue_exactly_as_the_dataset_package_does(run_dir: Path) -> None:
    run = open_run(run_dir)
    index = RunIndex(run_dir)
    try:
        for did in run.dialogues.dialogue_id:
            ours, theirs = index.dialogue(did), run.dialogue(did)
            assert ours is not None
            assert (ours.row, ours.persona, ours.turns) == (theirs.row, theirs.persona, theirs.turns)
            assert [ours.seen(i) for i in range(len(ours.turns))] == [
                theirs.seen(i) for i in range(len(theirs.turns))]
        assert index.dialogue("no-such-dialogue") is None
    finally:
        index.close()


def test_list_filters_search_sort_and_paging_match_pandas(tmp_path: Path) -> None:
    from spasm.dataset.synthetic import synthesize_run

    run_dir = synthesize_run(tmp_path / "syn", n_dialogues=240, n_personas=20)
    run = open_run(run_dir)
    dialogues = run.dialogues.merge(run.personas[["persona_id", "city", "age"]], on="persona_id")
    turns = run.turns
    index = RunIndex(run_dir)
    try:
        page = index.list_page(ListQuery(condition="concat", pairing="gpt/gpt", per_page=10, page=2))
        expected = dialogues[(dialogues.condition == "concat") & (dialogues.pairing == "gpt/gpt")]
        assert page.total == len(expected) and page.pages == -(-len(expected) // 10)
        assert [r["dialogue_id"] for r in page.rows] == sorted(expected.dialogue_id)[10:20]
        city = str(dialogues.city.iloc[0])
        page = index.list_page(ListQuery(persona={"city": city}, persona_min={"age": 30}, per_page=200))
        want = dialogues[(dialogues.city == city) & (dialogues.age >= 30)]
        assert sorted(r["dialogue_id"] for r in page.rows) == sorted(want.dialogue_id)
        hits = turns[turns.text.str.lower().str.contains("formal review", regex=False)]
        page = index.list_page(ListQuery(q="Formal REVIEW", per_page=200, sort="hits", desc=True))
        assert page.total == hits.dialogue_id.nunique()
        counts = hits.groupby("dialogue_id").size()
        assert [r["n_hits"] for r in page.rows] == sorted(counts, reverse=True)[:200]
        first = page.rows[0]
        assert "formal review" in first["snippet"].lower()
        prev_id, next_id, pos, total = index.neighbours(ListQuery(condition="ecp"), "d00003-ecp")
        assert (prev_id, next_id, pos, total) == ("d00002-ecp", "d00004-ecp", 4, 120)
    finally:
        index.close()


def test_pages_answer_and_unknown_or_traversing_paths_get_4xx(server: ViewerServer, run_dir: Path) -> None:
    did = str(open_run(run_dir).dialogues.dialogue_id.iloc[0])
    for path in ("/", "/dialogues", "/dialogues?condition=concat&q=warranty", f"/d/{_q(did)}",
                 f"/d/{_q(did)}/seen/1?fragment=1", f"/compare/{_q(did)}", "/static/viewer.js"):
        status, _, headers = get(server.base_url + path)
        assert status == 200, path
        assert "script-src 'self'" in headers["content-security-policy"]
    for path in ("/d/no-such-dialogue", "/d/..%2F..%2Fmanifest.json", "/d/%2e%2e", "/compare/nope",
                 f"/d/{_q(did)}/seen/99", "/static/..%2Fapp.py", "/static/app.py",
                 "/eval/report.html", "/api/labels/nope", "/manifest.json", "/turns.parquet/"):
        status, body, _ = get(server.base_url + path)
        assert 400 <= status < 500, path
        assert "Lumo 800" not in body and "schema_version" not in body
    assert get(server.base_url + "/dialogues?per_page=5000")[0] == 400
    assert get(server.base_url + "/dialogues?p.no_such_field=x")[0] == 400
    # DNS rebinding: a foreign Host header is refused even on loopback.
    assert get(server.base_url + "/", {"Host": "attacker.example:80"})[0] == 421


def _rewrite_run(source: Path, out: Path, dialogue_id: str, text: str) -> None:
    """A copy of ``source`` through the dataset writer, with the first utterance of one
    dialogue edited (as a redaction pass would): its later digests no longer match."""
    from spasm.dataset.store import write_finished_run
    from spasm.personas.schema import load_schema

    run = open_run(source)
    tables = {t: run.table(t).to_pylist() for t in ("personas", "dialogues", "turns")}
    for turn in tables["turns"]:
        if turn["dialogue_id"] == dialogue_id and turn["turn_index"] == 0:
            turn["text"] = text
    schema = load_schema(None)
    write_finished_run(out, tables, run.manifest,
                       persona_fields=(schema.field_names, schema.integer_fields()))


def test_a_changed_run_shows_a_failed_digest_check(tmp_path: Path, run_dir: Path) -> None:
    turns = open_run(run_dir).turns
    plain = turns[turns.messages.isna()].sort_values(["dialogue_id", "turn_index"])
    did = str(plain.dialogue_id.iloc[0])
    _rewrite_run(run_dir, tmp_path / "edited", did, "edited after the run")
    with ViewerServer(tmp_path / "edited") as srv:
        _, page, _ = get(f"{srv.base_url}/d/{_q(did)}")
        _, fragment, _ = get(f"{srv.base_url}/d/{_q(did)}/seen/1?fragment=1")
        _, first, _ = get(f"{srv.base_url}/d/{_q(did)}/seen/0?fragment=1")
    assert "✗ digest mismatch" in page and "edited after the run" in page
    assert 'data-verified="false"' in fragment and "does not hash to the stored digest" in fragment
    assert 'data-verified="true"' in first  # the turn before the edit still verifies


def test_the_overview_shows_the_figures_spasm_eval_wrote_as_data(tmp_path: Path, run_dir: Path) -> None:
    from spasm.evaluation.figures import ReportFigure, write_figures

    copy = tmp_path / "evaluated"
    shutil.copytree(run_dir, copy)
    (copy / "eval").mkdir()
    (copy / "eval" / "metrics.json").write_text(json.dumps({"echoing": {"method": "rule"}}))
    # The report's markup is not where the figures come from: a figure only in it is not shown.
    (copy / "eval" / "report.html").write_text(
        '<img alt="Only in the HTML" src="data:image/png;base64,iVBORw0KGgo=">')
    figure = ReportFigure.from_png("drift", "Drift <by> turn", b"\x89PNG\r\n\x1a\nfigure")
    write_figures(copy / "eval", [figure])
    with ViewerServer(copy) as srv:
        status, page, _ = get(srv.base_url + "/")
    assert status == 200
    assert f'<img alt="Drift &lt;by&gt; turn" src="{figure.data_uri()}">' in page
    assert "Only in the HTML" not in page
    (copy / "eval" / "figures.json").write_text("{not json")
    with ViewerServer(copy) as srv:
        status, page, _ = get(srv.base_url + "/")
    assert status == 200 and "<figure>" not in page


def test_labels_append_through_the_run_store_and_the_latest_wins(tmp_path: Path, run_dir: Path) -> None:
    copy = tmp_path / "labels"
    shutil.copytree(run_dir, copy)
    did = str(open_run(copy).dialogues.dialogue_id.iloc[0])
    with ViewerServer(copy) as srv:
        url = srv.base_url + "/api/labels"
        assert post(url, {"dialogue_id": did, "annotator": "ana", "echoing": "client"})[0] == 201
        status, data = post(url, {"dialogue_id": did, "annotator": "ana", "echoing": "none", "note": "x"})
        assert status == 201 and [(x["annotator"], x["echoing"]) for x in data["labels"]] == [("ana", "none")]
        assert data["history"] == 2
        assert post(url, {"dialogue_id": did, "annotator": "ana", "echoing": "maybe"})[0] == 422
        assert post(url, {"dialogue_id": "nope", "annotator": "ana", "echoing": "none"})[0] == 404
        assert post(url, {"dialogue_id": did, "annotator": "../x", "echoing": "none"})[0] == 422
        assert post(url, {"dialogue_id": did, "annotator": "ana", "extra": 1})[0] == 422
        assert post(url, b"echoing=none", {"Content-Type": "application/x-www-form-urlencoded"})[0] == 415
        cross = {"Origin": "http://attacker.example", "Sec-Fetch-Site": "cross-site"}
        assert post(url, {"dialogue_id": did, "annotator": "eve", "echoing": "both"}, cross)[0] == 403
    labels = open_run(copy).df("annotations").sort_values("labelled_at")
    assert list(labels.echoing) == ["client", "none"] and set(labels.annotator) == {"ana"}
    assert labels.labelled_at.is_monotonic_increasing and labels.annotation_id.is_unique
    assert all((copy / ".commits" / p.name[len("part-"):-len(".parquet")]).exists()
               for p in (copy / "annotations.parquet").iterdir())
    # Nothing but the annotations table (its parts and commit markers, under the run lock).
    before = {p.relative_to(run_dir) for p in run_dir.rglob("*") if p.is_file()}
    after = {p.relative_to(copy) for p in copy.rglob("*") if p.is_file()}
    assert {str(p).split("/")[0] for p in after - before} <= {"annotations.parquet", ".commits", ".lock"}


def test_a_label_waits_for_another_writer_and_says_so_when_it_cannot(
    tmp_path: Path, run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from spasm.dataset.lock import RunLock
    from spasm.viewer import annotations

    monkeypatch.setattr(annotations, "LOCK_WAIT_S", 0.3)
    copy = tmp_path / "busy"
    shutil.copytree(run_dir, copy)
    did = str(open_run(copy).dialogues.dialogue_id.iloc[0])
    with ViewerServer(copy) as srv, RunLock(copy):  # another writer of the run, e.g. spasm eval
        status, data = post(srv.base_url + "/api/labels", {"dialogue_id": did, "annotator": "ana",
                                                          "echoing": "none"})
    assert status == 409 and "not saved" in data["error"] and "being written" in data["error"]
    assert not open_run(copy).has("annotations")


def test_a_non_loopback_bind_requires_its_token(run_dir: Path) -> None:
    from spasm.viewer.cli import resolve_token

    assert resolve_token("127.0.0.1", None) is None
    generated = resolve_token("0.0.0.0", None)
    assert generated is not None and len(generated) >= 16
    with ViewerServer(run_dir, host="0.0.0.0", token=generated) as srv:
        base = srv.base_url
        assert get(base + "/")[0] == 401
        assert get(base + "/?token=wrong")[0] == 401
        assert get(base + "/static/viewer.css")[0] == 401
        assert post(base + "/api/labels", {"dialogue_id": "x", "annotator": "a", "echoing": "none"})[0] == 401
        status, _, headers = get(f"{base}/?token={generated}")
        assert status == 200 and "spasm_token=" in headers["set-cookie"]
        assert "httponly" in headers["set-cookie"].lower()
        assert get(base + "/dialogues", {"X-Spasm-Token": generated})[0] == 200
        assert get(base + "/dialogues", {"Cookie": f"spasm_token={generated}"})[0] == 200


def test_spasm_view_prints_its_url_serves_and_stops_on_ctrl_c(run_dir: Path, tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    from spasm.cli import main

    assert main(["view", str(tmp_path / "missing"), "--no-browser"]) == 2
    assert main(["view", str(run_dir), "--port", "70000", "--no-browser"]) == 2
    proc = subprocess.Popen([sys.executable, "-m", "spasm", "view", str(run_dir), "--port", "0",
                             "--no-browser"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.search(r"at (http://127\.0\.0\.1:\d+/)$", line.strip())
        assert found, line
        status, body, _ = get(found.group(1))
        assert status == 200 and "dialogues" in body
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
