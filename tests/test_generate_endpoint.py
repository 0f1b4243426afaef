"""End to end through the real openai SDK against our OpenAI-compatible server on 127.0.0.1."""

from __future__ import annotations

import hashlib
import json
import socket
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from spasm.cli import main
from spasm.dataset import open_run
from spasm.projection import messages_digest
from tests.conftest import endpoint_config


def _write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _tables(run: Path) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    return (
        pd.read_parquet(run / "personas.parquet"),
        pd.read_parquet(run / "dialogues.parquet"),
        pd.read_parquet(run / "turns.parquet"),
    )


def test_generate_both_conditions(server: Any, tmp_path: Path, capsys: Any) -> None:
    run = tmp_path / "run"
    cfg = _write(tmp_path, endpoint_config(server.base_url, conversations_per_persona=2))
    code = main(["generate", "--config", str(cfg), "--out", str(run), "--condition", "both",
                 "--no-progress"])
    assert code == 0
    out = capsys.readouterr().out
    assert f"Dataset: {run}" in out and "12/12 dialogues" in out
    personas, dialogues, turns = _tables(run)
    assert len(personas) == 3 and len(dialogues) == 3 * 2 * 2
    assert set(dialogues.condition) == {"ecp", "concat"}
    assert set(dialogues.client_model) == {"m"} and set(dialogues.pairing) == {"srv/srv"}
    assert dialogues.termination_reason.notna().all()
    # Every persona/conversation index under both conditions, same persona and seed.
    pairs = dialogues.groupby(["persona_id", "conversation_index"])
    for _, g in pairs:
        assert sorted(g.condition) == ["concat", "ecp"]
        assert g.seed.nunique() == 1
    # Alternation, starting with the client; non-empty text; utterance counts agree.
    for did, g in turns.groupby("dialogue_id"):
        g = g.sort_values("turn_index")
        assert list(g.turn_index) == list(range(len(g)))
        assert list(g.speaker) == [("client", "responder")[i % 2] for i in range(len(g))]
        assert (g.text.str.strip().str.len() > 0).all()
        assert dialogues.set_index("dialogue_id").loc[did, "n_utterances"] == len(g)
    # The responder never saw the persona card; the client was never told it is an AI.
    row = dialogues.iloc[0]
    card = personas.set_index("persona_id").loc[row.persona_id, "card"]
    assert card not in row.responder_system_prompt and card in row.client_system_prompt
    assert " AI" not in row.client_system_prompt
    for body in server.requests:
        system = body["messages"][0]["content"]
        if "You are a customer-service agent" in system:
            assert card not in json.dumps(body)
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["schema_version"] and manifest["status"] == "complete"
    assert manifest["counts"]["completed"] == 12


def test_messages_seen_are_reconstructible(server: Any, tmp_path: Path) -> None:
    run = tmp_path / "run"
    cfg = _write(tmp_path, endpoint_config(server.base_url))
    assert main(["generate", "--config", str(cfg), "--out", str(run), "--condition", "both",
                 "--no-progress"]) == 0
    _, dialogues, turns = _tables(run)
    sent = {messages_digest(b["messages"]) for b in server.requests if "messages" in b}
    opened = open_run(run)
    for did in dialogues.dialogue_id:
        view = opened.dialogue(did)
        assert len(view.turns) == len(turns[turns.dialogue_id == did]) > 0
        for i, t in enumerate(view.turns):
            seen = view.seen(i)
            assert seen.verified is True and messages_digest(seen.messages) == t["messages_sha256"]
            assert t["messages_sha256"] in sent  # exactly what went over the wire


def test_rerun_resumes_and_duplicates_nothing(server: Any, tmp_path: Path, capsys: Any) -> None:
    run = tmp_path / "run"
    cfg = _write(tmp_path, endpoint_config(server.base_url))
    args = ["generate", "--config", str(cfg), "--out", str(run), "--no-progress"]
    assert main(args) == 0
    first = pd.read_parquet(run / "turns.parquet")
    n_chats = sum("messages" in b for b in server.requests)
    assert main(args) == 0
    assert sum("messages" in b for b in server.requests) == n_chats  # nothing left: no calls
    pd.testing.assert_frame_equal(first, pd.read_parquet(run / "turns.parquet"))


def test_missing_key_env_var(tmp_path: Path, monkeypatch: Any, capsys: Any) -> None:
    monkeypatch.delenv("SPASM_TEST_KEY", raising=False)
    run = tmp_path / "run"
    code = main(["generate", "--base-url", "http://127.0.0.1:9/v1", "--model", "m",
                 "--api-key-env", "SPASM_TEST_KEY", "--out", str(run), "--no-progress"])
    assert code == 2
    err = capsys.readouterr().err
    assert "SPASM_TEST_KEY" in err
    assert not run.exists()


def test_refused_connection(tmp_path: Path, capsys: Any) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = tmp_path / "run"
    code = main(["generate", "--base-url", f"http://127.0.0.1:{port}/v1", "--model", "m",
                 "--out", str(run), "--no-progress"])
    assert code == 2
    assert "cannot connect" in capsys.readouterr().err
    assert not run.exists()


def test_unknown_config_key(tmp_path: Path, capsys: Any) -> None:
    data = endpoint_config("http://127.0.0.1:9/v1")
    data["dialogue"]["max_turn_per_agent"] = 3
    cfg = _write(tmp_path, data)
    run = tmp_path / "run"
    assert main(["generate", "--config", str(cfg), "--out", str(run)]) == 2
    err = capsys.readouterr().err
    assert "dialogue.max_turn_per_agent" in err and "unknown key" in err and str(cfg) in err
    assert not run.exists()


def test_schema_rejecting_everything_is_a_clear_error(
    server: Any, tmp_path: Path, capsys: Any
) -> None:
    schema = yaml.safe_load(Path("schemas/persona.yaml").read_text())
    schema["rules"].append({"id": "nobody", "description": "Nobody passes.", "when": {},
                            "require": {"age": {"max": 1}}})
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(schema))
    data = endpoint_config(server.base_url, personas={"schema_file": str(tmp_path / "schema.yaml")})
    cfg = _write(tmp_path, data)
    run = tmp_path / "run"
    assert main(["generate", "--config", str(cfg), "--out", str(run), "--no-progress"]) == 2
    assert "reject nearly everything" in capsys.readouterr().err
    assert not (run / "dialogues.parquet").exists()


def test_no_key_value_under_the_run_dir(server: Any, tmp_path: Path, monkeypatch: Any) -> None:
    secret = "sk-test-DO-NOT-LEAK-0123456789abcdef"
    monkeypatch.setenv("SPASM_SECRET_KEY", secret)
    run = tmp_path / "run"
    assert main(["generate", "--base-url", server.base_url, "--model", "m", "--api-key-env",
                 "SPASM_SECRET_KEY", "--out", str(run), "--personas", "2", "--no-progress"]) == 0
    for path in run.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path
    assert "SPASM_SECRET_KEY" in (run / "config.json").read_text()


@pytest.mark.e2e
def test_pairings_record_their_models(server: Any, tmp_path: Path) -> None:
    data = endpoint_config(server.base_url, personas={"n": 2}, pairings="grid")
    data["backends"] = {
        "a": {"kind": "openai", "base_url": server.base_url, "model": "model-a"},
        "b": {"kind": "openai", "base_url": server.base_url, "model": "model-b"},
    }
    cfg = _write(tmp_path, data)
    run = tmp_path / "run"
    assert main(["generate", "--config", str(cfg), "--out", str(run), "--no-progress"]) == 0
    dialogues = pd.read_parquet(run / "dialogues.parquet")
    assert sorted(set(dialogues.pairing)) == ["a/a", "a/b", "b/a", "b/b"]
    for row in dialogues.itertuples():
        assert row.client_model == f"model-{row.client_backend}"
        assert row.responder_model == f"model-{row.responder_backend}"
    calls = pd.read_parquet(run / "calls.parquet").merge(
        dialogues[["dialogue_id", "client_model", "responder_model"]], on="dialogue_id"
    )
    client = calls[calls.role == "client"]
    responder = calls[calls.role == "responder"]
    assert (client.model == client.client_model).all()
    assert (responder.model == responder.responder_model).all()
    assert set(calls.resolved_model) <= {"model-a-testserver", "model-b-testserver"}


def _scripted(body: dict[str, Any]) -> str:
    """Replies for the LLM validator, crafter and judge; plain chat otherwise."""
    system = body["messages"][0]["content"]
    if "persona for a simulated conversation is coherent" in system:
        persona = body["messages"][-1]["content"]
        ok = hashlib.md5(persona.encode()).digest()[0] % 3 != 0
        return json.dumps({"valid": ok, "reason": "fine" if ok else "I doubt this job here"})
    if "Rewrite persona descriptions" in system:
        return "You are someone with a rich inner life. " + body["messages"][-1]["content"]
    if "reached a natural end" in system:
        finished = body["messages"][-1]["content"].count("Client:") >= 3
        return json.dumps({"finished": finished, "reason": "they are done"})
    return "Could you tell me a bit more?"


def test_llm_validator_crafter_and_judge(tmp_path: Path) -> None:
    from spasm.testing import TestServer

    with TestServer(reply=_scripted) as srv:
        data = endpoint_config(
            srv.base_url, personas={"n": 6, "llm_validate": True, "llm_craft": True},
            termination={"judge": True, "rules": False, "min_utterances": 4},
            dialogue={"max_turns_per_agent": 8},
        )
        cfg = _write(tmp_path, data)
        run = tmp_path / "run"
        assert main(["generate", "--config", str(cfg), "--out", str(run), "--no-progress"]) == 0
    personas = pd.read_parquet(run / "personas.parquet")
    rejected = pd.read_parquet(run / "persona_rejections.parquet")
    assert (personas.card_source == "llm").all()
    assert personas.card.str.startswith("You are someone with a rich inner life.").all()
    assert all(json.loads(v)[-1]["stage"] == "llm" for v in personas.verdicts)
    llm_rejects = rejected[rejected.stage == "llm"]
    assert len(llm_rejects) > 0
    for reasons in llm_rejects.reasons:
        assert json.loads(reasons) == ["I doubt this job here"]
    dialogues = pd.read_parquet(run / "dialogues.parquet")
    assert set(dialogues.termination_reason) == {"natural_judge"}
    assert (dialogues.n_utterances == 6).all()
    calls = pd.read_parquet(run / "calls.parquet")
    assert {"validator", "crafter", "judge", "client", "responder"} <= set(calls.role)
