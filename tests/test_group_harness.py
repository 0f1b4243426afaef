"""Harness levels for group seats: each participant at its own level A–E, the
layers seeing the group (labels by participant id, the seat's role deciding client or
responder behaviour), audits and persona probes per seat, frames that verify."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pandas as pd
import pytest

from spasm.config import parse_config
from spasm.dataset import open_run
from spasm.engine import Engine
from spasm.harness.checker import rule_violations
from spasm.harness.context import compress_rules
from spasm.harness.profile import Presence, profile_of
from spasm.history import History
from spasm.testing import TestServer
from tests.conftest import make_persona
from tests.test_group import _group_data

LEVELS = {"Ana": "E", "Ben": "C", "Carla": "A", "Facilitator": "B"}
SEATS = (("Ana", "client", "peer-support facilitator"), ("Ben", "client", "peer-support facilitator"),
         ("Carla", "client", "peer-support facilitator"),
         ("Facilitator", "responder", "peer-support facilitator"))


def _data(base_url: str, **harness: Any) -> dict[str, Any]:
    data = _group_data(base_url, max_utterances=12)
    for p in data["participants"]:
        p["level"] = LEVELS[p["id"]]
    data["harness"] = {"window": 4, "stride": 2, **harness}
    return data


def _presence(role: str) -> Presence:
    return Presence(role=role, seats=SEATS, responder_role="peer-support facilitator",  # type: ignore[arg-type]
                    instructions=None, max_utterances=12)


def test_a_seat_profile_names_everyone_by_id_and_takes_its_role_from_the_seat() -> None:
    config = parse_config(_data("http://127.0.0.1:9/v1"), "<t>")
    ben = profile_of("Ben", "srv", config, make_persona(first_name="Benjamin"),
                     _presence("client"))
    assert ben.seat == "client" and ben.name == "Ben"  # the transcripts' name, not the card's
    assert ben.others == ("Ana", "Carla", "Facilitator")
    assert ben.clients == ("Ana", "Ben", "Carla")
    assert ben.labels == {"Ana": "Ana", "Ben": "You", "Carla": "Carla", "Facilitator": "Facilitator"}
    assert ben.max_utterances == 12 and "group conversation" in ben.checker_who
    history = History().append("Ana", "Hi all.").append("Ben", "Hello.").append("Facilitator", "Welcome!")
    assert ben.lines(history.utterances) == "Ana: Hi all.\nYou: Hello.\nFacilitator: Welcome!"
    assert ben.last_partner(history) == "Welcome!"
    host = profile_of("Facilitator", "srv", config, None, _presence("responder"))
    assert host.seat == "responder" and host.role == "peer-support facilitator"
    assert host.labels["Facilitator"] == "You" and host.clients == ("Ana", "Ben", "Carla")
    # The two-party profile is what it always was.
    two = profile_of("client", "srv", config, make_persona(first_name="Ana"))
    assert (two.seat, two.others, two.clients, two.name) == ("client", ("responder",), ("client",), "Ana")
    assert two.labels == {"client": "You", "responder": f"The {config.dialogue.responder_role}"}


def test_a_client_seats_boundaries_are_a_clients_whatever_its_id() -> None:
    advice = "As an AI, I suggest you try breathing exercises."
    assert rule_violations(advice, "client", "facilitator")
    assert not rule_violations(advice, "responder", "facilitator")


def test_the_record_of_older_group_turns_labels_each_speaker_by_id() -> None:
    config = parse_config(_data("http://127.0.0.1:9/v1"), "<t>")
    ana = profile_of("Ana", "srv", config, make_persona(), _presence("client"))
    h = History()
    for who, text in [("Facilitator", "Welcome, everyone."), ("Ana", "I am nervous."),
                      ("Ben", "Me too, honestly."), ("Carla", "First time here.")]:
        h = h.append(who, text)
    from spasm.harness.context import StructuredContext

    record = compress_rules(StructuredContext(), h.utterances, 4, "Ana", dict(ana.labels))
    assert record.key_events[:2] == ["Facilitator: Welcome, everyone.", "You: I am nervous."]
    assert record.key_events[-1] == "Carla: First time here."


@pytest.fixture(scope="module")
def group_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("grp") / "run"
    with TestServer() as srv:
        config = parse_config(_data(srv.base_url, audit=True, persona_probes=True), "<t>")
        summary = anyio.run(Engine(config, run, progress=False, sleep_scale=0).run)
    assert summary.completed == summary.planned == 4, summary.line()
    return run


def test_each_seat_runs_at_its_own_level(group_run: Path) -> None:
    dialogues = pd.read_parquet(group_run / "dialogues.parquet")
    seats = pd.read_parquet(group_run / "participants.parquet")
    turns = pd.read_parquet(group_run / "turns.parquet")
    calls = pd.read_parquet(group_run / "calls.parquet")
    assert set(dialogues.harness_level) == {"E/C/A/B"}  # every seat's level, in turn order
    assert dict(zip(seats.participant_id, seats.level, strict=True)) == LEVELS
    verdicts = turns.checker_verdict.map(lambda v: json.loads(v)["mode"] if isinstance(v, str) else None)
    by = turns.assign(mode=verdicts).groupby("speaker")
    # E checks and may rewrite; below E the audit checks every accepted reply.
    assert set(by.get_group("Ana")["mode"]) == {"verify"}
    assert set(by.get_group("Ben")["mode"]) == set(by.get_group("Carla")["mode"]) == {"audit"}
    # State at C and E only; level A's frames are the projection's (not stored), B's and up
    # are orchestrated (stored).
    has_state = turns.groupby("speaker").state.apply(lambda s: s.notna().all())
    assert has_state["Ana"] and has_state["Ben"] and not has_state["Carla"]
    assert not has_state["Facilitator"]
    stored = turns.groupby("speaker").messages.apply(lambda s: s.notna().all())
    assert not stored["Carla"] and stored["Ana"] and stored["Ben"] and stored["Facilitator"]
    roles = set(calls.role)
    assert {"checker", "rewrite", "reducer", "audit", "policy", "persona_probe"} <= roles


def test_harnessed_group_frames_name_the_others_and_verify(group_run: Path) -> None:
    seats = pd.read_parquet(group_run / "participants.parquet")
    ana = seats[(seats.dialogue_id == "g0000-ecp") & (seats.participant_id == "Ana")].iloc[0]
    # The policy layer keeps the group frame (who is present) and adds the compiled policy.
    assert "You appear in it as Ana" in ana.system_prompt and "Who you are:" in ana.system_prompt
    turns = pd.read_parquet(group_run / "turns.parquet")
    late = turns[(turns.dialogue_id == "g0000-ecp") & (turns.speaker == "Ana")].sort_values(
        "turn_index").iloc[-1]
    frame = json.loads(late.messages)
    users = [m["content"] for m in frame if m["role"] == "user"]
    assert any(u.startswith(("Ben: ", "Carla: ", "Facilitator: ")) for u in users)
    record = next(m["content"] for m in frame[1:] if m["role"] == "system")
    assert "summarised" in record and ("- Ben: " in record or "- Carla: " in record)
    reader = open_run(group_run)
    for did in pd.read_parquet(group_run / "dialogues.parquet").dialogue_id:
        view = reader.dialogue(did)
        assert all(view.seen(i).verified for i in range(len(view.turns))), did


def test_every_client_seat_answers_its_own_persona_probes(group_run: Path) -> None:
    turns = pd.read_parquet(group_run / "turns.parquet")
    seats = pd.read_parquet(group_run / "participants.parquet")
    personas = pd.read_parquet(group_run / "personas.parquet").set_index("persona_id")
    for (did, speaker), own in turns.groupby(["dialogue_id", "speaker"]):
        last = own.sort_values("turn_index").iloc[-1]
        probed = json.loads(last.probe)["persona"] if isinstance(last.probe, str) else []
        if speaker == "Facilitator":
            assert probed == []
            continue
        persona_id = seats[(seats.dialogue_id == did) & (seats.participant_id == speaker)].persona_id.iloc[0]
        concern = personas.loc[persona_id, "concern"]
        asked = {p["field"]: p["expected"] for p in probed}
        assert asked["concern"] == concern, (did, speaker)  # its own persona, not another seat's


@pytest.mark.e2e
def test_persona_consistency_judges_each_client_seat_against_its_own_card(tmp_path: Path) -> None:
    """``spasm eval --consistency`` on a group run: each client seat's lines and probe answers
    go to the judge with that seat's card (one call per seat and measure); the dialogue's score
    pools the seats' labels."""
    from spasm.evaluation import evaluate, register_embedder
    from spasm.evaluation.testing import LookupEmbedder
    from tests.test_persona_probes import _answer

    register_embedder("lookup", LookupEmbedder)
    run = tmp_path / "run"
    with TestServer(reply=_answer) as srv:
        data = _group_data(srv.base_url, max_utterances=8)
        data["termination"] = {"rules": False}
        data["harness"] = {"persona_probes": True}
        summary = anyio.run(Engine(parse_config(data, "<t>"), run, progress=False, sleep_scale=0).run)
        assert summary.completed == 4, summary.line()
        sent = len(srv.requests)
        evaluate(run, embedder="lookup", progress=False, consistency=True)
        judged = [r for r in srv.requests[sent:]
                  if "labels" in str(r["messages"][0]["content"])]
    per = pd.read_parquet(run / "eval" / "per_dialogue.parquet").set_index("dialogue_id")
    assert per["consistency_prompt_to_line"].tolist() == [1.0] * 4
    assert per["qa_consistency"].tolist() == pytest.approx([0.75] * 4)  # [0, 1, 1, 1] per seat
    calls = pd.read_parquet(run / "calls.parquet")
    # dialogues x client seats x (prompt-to-line, line-to-line, Q&A); repeats come from the cache
    assert (calls.role == "eval_consistency").sum() == 4 * 3 * 3
    personas = pd.read_parquet(run / "personas.parquet").set_index("persona_id")
    seats = pd.read_parquet(run / "participants.parquet")
    cards = {str(c) for c in personas.card}
    for r in judged:
        user = str(r["messages"][-1]["content"])
        if user.startswith("Persona card:"):
            assert sum(card in user for card in cards) == 1  # one seat's card, not the first's
    first = seats[(seats.dialogue_id == "g0000-ecp") & (seats.role == "client")].persona_id
    shown = {card for card in cards for r in judged if card in str(r["messages"][-1]["content"])}
    assert {personas.loc[p, "card"] for p in first} <= shown
