"""``payload_leak``: a Client utterance that repeats a span found only in
events its egocentric frame would not show, by condition, offline.

On a hand-written run of agents that act (tests/tool_run.py, written through the run store):
the CONCAT dialogue's Client recites the tracking number only the Responder's lookup returned,
the ECP one repeats only what it was told or saw itself; ``spasm eval`` reports the rate by
condition (metrics.json, per_dialogue.parquet, compare.json, the report). The rules of a span,
and a group dialogue's seats each checked against their own frame.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from spasm.cli import main
from spasm.evaluation.leaks import dialogue_leaks, payload_spans
from tests.tool_run import IDS, write_tool_run


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = write_tool_run(tmp_path_factory.mktemp("leak") / "run")
    assert main(["eval", str(run), "--no-progress"]) == 0
    return run


def test_concat_lets_the_client_repeat_a_hidden_payload_and_ecp_does_not(evaluated: Path) -> None:
    metrics = json.loads((evaluated / "eval" / "metrics.json").read_text())
    leak = metrics["payload_leak"]
    assert leak["frame"] == "ecp" and leak["checked"] == 2
    rates = {(r["pairing"], r["condition"]): r for r in leak["rates"]}
    assert rates[("all", "concat")]["n_leaking"] == 1 and rates[("all", "concat")]["rate"] == 1.0
    assert rates[("all", "ecp")]["n_leaking"] == 0 and rates[("all", "ecp")]["rate"] == 0.0
    assert rates[("all", "all")]["spans"] == 1
    [example] = leak["examples"]
    assert example["span"] == "trk-99812" and example["tool"] == "lookup_order"
    assert example["actor"] == "responder" and example["turn"] == 2
    per = pd.read_parquet(evaluated / "eval" / "per_dialogue.parquet").set_index("dialogue_id")
    assert per.loc[IDS["concat"], "payload_leak"] == 1.0
    assert per.loc[IDS["ecp"], "payload_leak"] == 0.0
    compare = json.loads((evaluated / "eval" / "compare.json").read_text())
    assert "payload_leak" in json.dumps(compare)
    html = (evaluated / "eval" / "report.html").read_text(encoding="utf-8")
    assert "Payload leaks" in html and "trk-99812" in html


def _two_party(texts: list[str], events: list[dict[str, Any]]) -> list[Any]:
    row = {"dialogue_id": "d", "condition": "concat", "client_system_prompt": "You are Ana.",
           "responder_system_prompt": "You help.", "responder_role": "agent"}
    turns = [{"dialogue_id": "d", "turn_index": i, "text": t,
              "speaker": "client" if i % 2 == 0 else "responder"} for i, t in enumerate(texts)]
    return dialogue_leaks(row, turns, events)


def _call(turn: int, actor: str, visible: list[str], result: str, seq: int = 0) -> dict[str, Any]:
    return {"seq": seq, "turn_index": turn, "kind": "tool_result", "actor": actor,
            "call_id": f"c{seq}", "tool": "lookup", "arguments": None, "result": result,
            "error": None, "visible_to": json.dumps(visible), "notice": None}


def test_what_the_frame_showed_is_no_leak() -> None:
    hidden = _call(1, "responder", ["responder"], json.dumps({"code": "ZX-4471", "n": 7}))
    # Said aloud by the Responder first: the Client may repeat it.
    assert _two_party(["Hi", "Your code is ZX-4471.", "So ZX-4471?"], [hidden]) == []
    # Shown to the Client (visible_to names it): not hidden.
    shown = _call(1, "responder", ["responder", "client"], json.dumps({"code": "ZX-4471"}))
    assert _two_party(["Hi", "Done.", "So ZX-4471?"], [shown]) == []
    # The Client's own result: it saw it.
    own = _call(2, "client", ["client"], json.dumps({"code": "ZX-4471"}))
    assert _two_party(["Hi", "Done.", "So ZX-4471?"], [own]) == []
    # Hidden, and repeated: a leak (the short number 7 never counts).
    [leak] = _two_party(["Hi", "Done.", "Is it zx-4471, 7 days?"], [hidden])
    assert leak.span == "zx-4471" and leak.turn_index == 2 and leak.speaker == "client"
    # A span inside a longer word is no match.
    assert _two_party(["Hi", "Done.", "ZX-44710"], [hidden]) == []


def test_spans_are_leaves_long_strings_are_runs_of_words() -> None:
    assert payload_spans(json.dumps({"status": "shipped", "ok": True, "n": 12, "id": 48213})) == {
        "shipped", "48213"}
    long = "the parcel left the depot in Leeds on Monday morning"
    spans = payload_spans(json.dumps({"note": long}))
    assert "the parcel left the depot in" in spans and "leeds on monday morning" not in spans
    assert all(len(s.split()) == 6 for s in spans)
    assert payload_spans("timeout after 10 s") == {"timeout after 10 s"}  # not JSON: one string


def test_each_client_seat_of_a_group_is_checked_against_its_own_frame() -> None:
    seats = [{"dialogue_id": "g", "position": i, "participant_id": pid, "role": role,
              "persona_id": "p" if role == "client" else None, "system_prompt": f"You are {pid}.",
              "speaker_names": "prefix"}
             for i, (pid, role) in enumerate([("Ana", "client"), ("Ben", "client"),
                                              ("Helper", "responder")])]
    row = {"dialogue_id": "g", "condition": "concat", "responder_role": "facilitator"}
    texts = [("Ana", "Hello"), ("Ben", "Hi"), ("Helper", "One moment."),
             ("Ana", "Is it QK-1200?"), ("Ben", "QK-1200, I guess.")]
    turns = [{"dialogue_id": "g", "turn_index": i, "speaker": s, "text": t}
             for i, (s, t) in enumerate(texts)]
    shown_to_ben = _call(2, "Helper", ["Helper", "Ben"], json.dumps({"ref": "QK-1200"}))
    leaks = dialogue_leaks(row, turns, [shown_to_ben], seats)
    assert [(x.speaker, x.span) for x in leaks] == [("Ana", "qk-1200")]
