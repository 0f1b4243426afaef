"""A persona's language end to end: the schema field, the frames that ask for it, the QA scan
that flags utterances in another language, the export that drops them unless ``--allow-qa``,
and the viewer's filter, over real Parquet runs (the engine on the test server, or the run
store) and real HTTP.

Other languages appear here only as test data for the language feature."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pandas as pd
import pytest
import yaml

from spasm.agents import client_instructions, client_system_prompt, responder_system_prompt
from spasm.cli import main
from spasm.dataset import open_run
from spasm.dataset.synthetic import write_run
from spasm.engine import Engine
from spasm.errors import ConfigError, UserError
from spasm.export.pipeline import ExportOptions, export_run
from spasm.export.qa import scan_run, write_qa
from spasm.export.scans import ScanContext, scan_text
from spasm.export.select import Selection
from spasm.personas import load_schema, render_persona_card
from spasm.testing import TestServer
from tests.conftest import config_from, endpoint_config

pytest.importorskip("py3langid", reason="language identification needs the 'eval' extra")

ENGLISH = [
    "My printer jams every single morning and I have a report due today.",
    "I'm sorry to hear that. Which printer model is it, and how old is it?",
    "It is the office laser printer, about three years old, on the second floor.",
    "Please open the rear tray and check whether a sheet is stuck inside the rollers.",
]
SPANISH = "Mi impresora se atasca todas las mañanas y necesito entregar el informe hoy."
SPANISH_CLIENT = [
    SPANISH,
    "Es la impresora láser de la oficina, tiene unos tres años y está en el segundo piso.",
    "Ya lo he intentado dos veces y la hoja sigue atascada dentro del rodillo.",
    "Muchas gracias por la ayuda, ahora mismo lo pruebo y le cuento.",
]


# --------------------------------------------------------------------------- frames and schema

def test_english_or_no_language_leaves_the_frames_as_they_were() -> None:
    role = "customer-service agent"
    for english in (None, "", "en", "English", "en-GB"):
        assert client_instructions(role, english) == client_instructions(role)
        card = "You are Ana."
        assert client_system_prompt(card, role, english) == client_system_prompt(card, role)
        assert responder_system_prompt(role, "Be kind.", english) == responder_system_prompt(role, "Be kind.")
    assert "Spanish" not in client_instructions(role) and "language" not in responder_system_prompt(role)


def test_a_non_english_persona_is_asked_for_its_language() -> None:
    role = "customer-service agent"
    for spanish in ("es", "Spanish", "es-MX"):
        assert "Write every message in Spanish, your own language." in client_instructions(role, spanish)
        assert ("The conversation is in Spanish: write every reply in Spanish."
                in responder_system_prompt(role, None, spanish))
    assert "in Portuguese" in client_system_prompt("You are Ana.", role, "pt-BR")


def test_the_schema_field_is_opt_in_checked_and_not_a_card_trait(tmp_path: Path) -> None:
    bundled = load_schema()
    assert "language" not in bundled.fields  # opt-in: the default schema draws what it always drew
    persona = {"first_name": "Ana", "age": 30, "occupation": "Nurse", "city": "Madrid, Spain"}
    assert render_persona_card({**persona, "language": "Spanish"}) == render_persona_card(persona)
    data = yaml.safe_load(Path("schemas/persona.yaml").read_text())
    data["fields"]["language"] = {"type": "categorical", "values": ["English", "Klingonese"]}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"language.*'Klingonese' is not a language"):
        load_schema(path)
    data["fields"]["language"] = {"type": "integer", "min": 1, "max": 2}
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="must be categorical"):
        load_schema(path)


# --------------------------------------------------------------------------- a Spanish run

def _spanish_reply(body: dict[str, Any]) -> str:
    """The Client writes Spanish; the Responder answers in English (the planted fault)."""
    messages = body["messages"]
    system = str(messages[0].get("content") or "") if messages[0]["role"] == "system" else ""
    depth = sum(m["role"] in ("user", "assistant") for m in messages)
    if "write every reply in Spanish" in system:
        return ENGLISH[(1 + 2 * depth) % 4]
    return SPANISH_CLIENT[depth % 4]


@pytest.fixture(scope="module")
def spanish_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    tmp = tmp_path_factory.mktemp("spanish")
    data = yaml.safe_load(Path("schemas/persona.yaml").read_text())
    data["fields"]["language"] = {"type": "categorical", "values": ["Spanish"]}
    schema = tmp / "schema.yaml"
    schema.write_text(yaml.safe_dump(data, allow_unicode=True))
    with TestServer(reply=_spanish_reply) as srv:
        config = endpoint_config(srv.base_url, personas={"n": 1, "schema_file": str(schema)},
                                 dialogue={"max_turns_per_agent": 2, "max_tokens": 60},
                                 termination={"rules": False, "min_utterances": 4})
        summary = anyio.run(Engine(config_from(config), tmp / "run", progress=False, sleep_scale=0.0).run)
        requests = srv.requests
    assert summary.completed == 1, summary.line()
    return tmp / "run", requests


def test_a_spanish_persona_is_stored_and_its_prompts_ask_for_spanish(
    spanish_run: tuple[Path, list[dict[str, Any]]],
) -> None:
    run, requests = spanish_run
    personas = pd.read_parquet(run / "personas.parquet")
    assert personas["language"].tolist() == ["Spanish"]
    assert "language" not in personas["card"].iloc[0].lower()
    dialogue = pd.read_parquet(run / "dialogues.parquet").iloc[0]
    assert "Write every message in Spanish, your own language." in dialogue["client_system_prompt"]
    assert "write every reply in Spanish." in dialogue["responder_system_prompt"]
    systems = {str(r["messages"][0]["content"]) for r in requests if r["messages"][0]["role"] == "system"}
    assert any("Write every message in Spanish" in s for s in systems)  # what the model was sent
    assert any("write every reply in Spanish" in s for s in systems)


def test_the_qa_scan_flags_english_in_a_spanish_dialogue(spanish_run: tuple[Path, list[dict[str, Any]]],
                                                         tmp_path: Path) -> None:
    run, _ = spanish_run
    result = scan_run(open_run(run))
    found = [r for r in result.rows if r.kind == "off_language"]
    turns = pd.read_parquet(run / "turns.parquet")
    speakers = dict(zip(turns["turn_index"], turns["speaker"], strict=True))
    assert [r.turn_index for r in found] == [1, 3]  # the Responder's English replies
    assert {speakers[r.turn_index] for r in found} == {"responder"}
    assert all(r.evidence.startswith("en (p=") and "expected es" in r.evidence for r in found)
    assert "py3langid" in result.summary.languages


# --------------------------------------------------------------------------- an English run

@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An English run whose second dialogue has one Spanish utterance (the Client's second)."""
    run = write_run(
        tmp_path_factory.mktemp("planted") / "run",
        [{"persona_id": "p0", "card": "An office worker."}, {"persona_id": "p1", "card": "A nurse."}],
        [
            {"dialogue_id": "clean", "persona_id": "p0", "seed": 1, "texts": ENGLISH},
            {"dialogue_id": "planted", "persona_id": "p1", "seed": 2,
             "texts": [ENGLISH[0], ENGLISH[1], SPANISH, ENGLISH[3]]},
        ],
    )
    write_qa(run, scan_run(open_run(run)))
    return run


def test_a_planted_wrong_language_utterance_is_a_finding(planted: Path) -> None:
    qa = pd.read_parquet(planted / "qa.parquet")
    found = qa[qa["kind"] == "off_language"]
    assert found[["dialogue_id", "turn_index"]].values.tolist() == [["planted", 2]]
    row = found.iloc[0]
    assert (row["start"], row["end"]) == (0, len(SPANISH))
    assert row["evidence"].startswith("es (p=") and "expected en" in row["evidence"]
    assert pd.isna(row["redaction"])  # not redactable: the dialogue is dropped or kept whole
    # the scan itself: too short to classify, and the persona's own language, are never flagged
    assert scan_text("Hola, gracias", ScanContext(), ["off_language"]) == []
    assert scan_text(SPANISH, ScanContext(language="es"), ["off_language"]) == []


def test_export_drops_it_unless_allow_qa(planted: Path, tmp_path: Path, capsys: Any) -> None:
    stats = export_run(planted, tmp_path / "lib", ExportOptions(formats=["openai"], split=(1.0,))).stats
    assert stats.conversations == 1 and stats.dropped == {"qa:off_language": 1}
    assert main(["export", str(planted), "--out", str(tmp_path / "dropped"), "--format", "hf",
                 "--split", "1"]) == 0
    assert main(["export", str(planted), "--out", str(tmp_path / "kept"), "--format", "hf",
                 "--split", "1", "--allow-qa", "off_language"]) == 0
    capsys.readouterr()

    def ids(out: Path) -> set[str]:
        return set(pd.concat([pd.read_parquet(f) for f in (out / "data").glob("*.parquet")])["dialogue_id"])

    assert ids(tmp_path / "dropped") == {"clean"}
    assert ids(tmp_path / "kept") == {"clean", "planted"}
    card = json.loads((tmp_path / "dropped" / "card.json").read_text())
    assert "py3langid" in json.dumps(card)
    with pytest.raises(UserError, match="off_langauge"):  # a typo is refused, not ignored
        Selection(allow_qa=["off_langauge"]).check_kinds()


# --------------------------------------------------------------------------- the viewer

def test_the_viewer_filters_dialogues_by_language_flag(planted: Path) -> None:
    pytest.importorskip("fastapi", reason="the viewer needs the 'view' extra")
    pytest.importorskip("duckdb", reason="the viewer needs the 'view' extra")
    from spasm.viewer.server import ViewerServer
    from tests.test_viewer_http import get

    with ViewerServer(planted) as srv:
        pages = {lang: get(f"{srv.base_url}/dialogues?lang={lang}") for lang in
                 ("yes", "no", "client", "responder", "maybe")}
        _, listing, _ = get(f"{srv.base_url}/dialogues")
    for lang, want in (("yes", {"planted"}), ("no", {"clean"}), ("client", {"planted"}),
                       ("responder", set())):
        status, body, _ = pages[lang]
        assert status == 200, lang
        got = {d for d in ("clean", "planted") if f'data-dialogue="{d}"' in body}
        assert got == want, lang
    assert pages["maybe"][0] == 400 and "lang" in pages["maybe"][1]
    assert 'name="lang"' in listing and "Off-language turns" in listing
