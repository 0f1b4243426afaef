"""`spasm view` of runs with a person in a seat, over HTTP against a real uvicorn server on
127.0.0.1: the dialogue page says who filled each seat (format 1.10: ``llm``, ``function`` or
``human``, and a person's pseudonymous operator and interface), for a two-party dialogue from
its row and for a group dialogue from each seat's row; a run that records no kinds shows none."""

from __future__ import annotations

import html
import re
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the viewer needs the 'view' extra: pip install 'spasm[view]'")
pytest.importorskip("duckdb", reason="the viewer needs the 'view' extra: pip install 'spasm[view]'")

from spasm.dataset.store import write_finished_run
from spasm.viewer.server import ViewerServer
from tests.test_viewer_http import get

PERSONA = {"persona_id": "p0", "persona_index": 0, "card": "A person with a late parcel."}


def _dialogue(did: str, **extra: Any) -> dict[str, Any]:
    return {"dialogue_id": did, "persona_id": "p0", "conversation_index": int(did[1:]), "condition": "ecp",
            "pairing": "human×m", "client_backend": "human", "client_model": "human",
            "responder_backend": "bot", "responder_model": "m", "seed": 0, "n_utterances": 2,
            "termination_reason": "ended_by_person", **extra}


def _turns(did: str, speakers: tuple[str, ...]) -> list[dict[str, Any]]:
    return [{"dialogue_id": did, "turn_index": t, "speaker": s, "text": f"line {t} of {s}"}
            for t, s in enumerate(speakers)]


def _page(run: Path, did: str) -> str:
    with ViewerServer(run) as srv:
        status, body, _ = get(f"{srv.base_url}/d/{urllib.parse.quote(did, safe='')}")
    assert status == 200, body
    return body


def test_the_dialogue_page_says_who_filled_each_two_party_seat(tmp_path: Path) -> None:
    run = tmp_path / "played"
    write_finished_run(run, {
        "personas": [PERSONA],
        "dialogues": [_dialogue("d0", client_kind="human", responder_kind="llm", operator="op-3f2a01",
                                interface="terminal"),
                      _dialogue("d1", client_kind="function", responder_kind="llm")],
        "turns": _turns("d0", ("client", "responder")) + _turns("d1", ("client", "responder")),
    }, {"schema_version": "1.10"}, persona_fields=([], set()))
    page = html.unescape(_page(run, "d0"))
    client = re.search(r'<span class="pill kind kind-human" id="client-kind"[^>]*>([^<]*)</span>', page)
    assert client is not None and client.group(1) == "human · op-3f2a01 (terminal)"
    responder = re.search(r'id="responder-kind"[^>]*>([^<]*)</span>', page)
    assert responder is not None and responder.group(1) == "llm"  # a model has no operator
    other = html.unescape(_page(run, "d1"))
    assert re.search(r'id="client-kind"[^>]*>function</span>', other)
    assert "op-3f2a01" not in other
    # A run that records no kinds (every run without a person) shows none.
    plain = tmp_path / "plain"
    write_finished_run(plain, {"personas": [PERSONA], "dialogues": [_dialogue("d0")],
                               "turns": _turns("d0", ("client", "responder"))},
                       {"schema_version": "1.10"}, persona_fields=([], set()))
    assert 'id="client-kind"' not in _page(plain, "d0")


def test_the_participants_table_gives_each_group_seats_kind_and_operator(tmp_path: Path) -> None:
    ids = (("Ana", "client", "llm"), ("Ben", "client", "human"), ("Facilitator", "responder", "llm"))
    seats = [{"dialogue_id": "g0", "participant_id": pid, "position": i, "role": role,
              "persona_id": None if role == "responder" else f"p-{pid.lower()}", "backend": "b", "model": "m",
              "kind": kind, **({"operator": "op-b0b0b0", "interface": "web"} if kind == "human" else {})}
             for i, (pid, role, kind) in enumerate(ids)]
    run = tmp_path / "group"
    write_finished_run(run, {
        "personas": [PERSONA],
        "dialogues": [_dialogue("g0", operator="op-b0b0b0", interface="web")],
        "turns": [{**t, "role": "responder" if t["speaker"] == "Facilitator" else "client"}
                  for t in _turns("g0", ("Ana", "Facilitator", "Ben"))],
        "participants": seats,
    }, {"schema_version": "1.10"}, persona_fields=([], set()))
    page = html.unescape(_page(run, "g0"))
    rows = dict(re.findall(r'data-participant="([^"]+)">.*?<td class="seat-kind">([^<]*)</td>', page))
    assert rows == {"Ana": "llm", "Ben": "human · op-b0b0b0 (web)", "Facilitator": "llm"}
    assert ">kind</th>" in page
