"""Language compliance: a planted wrong-language utterance is flagged, read back from Parquet.

Other languages appear here only as test data for the language feature."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from spasm.dataset.synthetic import write_run
from spasm.evaluation import evaluate, register_embedder
from spasm.evaluation.language import detect, expected_language
from spasm.evaluation.testing import LookupEmbedder
from tests.conftest import make_persona

register_embedder("lookup", LookupEmbedder)

ENGLISH = [
    "My printer jams every single morning and I have a report due today.",
    "I'm sorry to hear that. Which printer model is it, and how old is it?",
    "It is the office laser printer, about three years old, on the second floor.",
    "Please open the rear tray and check whether a sheet is stuck inside the rollers.",
]
SPANISH = "Mi impresora se atasca todas las mañanas y necesito entregar el informe hoy."


def test_identifier_on_known_sentences() -> None:
    assert detect(ENGLISH[0])[0] == "en"
    lang, prob = detect(SPANISH)
    assert lang == "es" and prob > 0.9
    assert detect("ok thanks") == (None, 0.0)  # too short to classify


def test_expected_language_from_the_persona() -> None:
    assert expected_language(None) == "en"
    assert expected_language("Spanish") == "es"
    assert expected_language("pt-BR") == "pt"
    assert expected_language(make_persona(language="pt-BR").language) == "pt"
    assert expected_language(make_persona(language=None).language) == "en"


@pytest.mark.e2e
def test_a_planted_wrong_language_utterance_is_flagged(tmp_path: Path) -> None:
    planted = [ENGLISH[0], ENGLISH[1], SPANISH, ENGLISH[3]]  # the Client's second turn
    run = write_run(
        tmp_path / "run",
        [{"persona_id": "p0", "card": "An office worker."}],
        [
            {"dialogue_id": "clean", "persona_id": "p0", "seed": 1, "texts": ENGLISH},
            {"dialogue_id": "planted", "persona_id": "p0", "condition": "concat", "seed": 1,
             "texts": planted},
        ],
    )
    m = evaluate(run, embedder="lookup", progress=False)
    assert m.language is not None and m.language.n_flagged == 1
    flag = m.language.flagged[0]
    assert (flag.dialogue_id, flag.turn_index, flag.speaker) == ("planted", 2, "client")
    assert (flag.expected, flag.detected) == ("en", "es")
    per = pd.read_parquet(run / "eval" / "per_dialogue.parquet").set_index("dialogue_id")
    assert per.loc["planted", "language_compliance_client"] == pytest.approx(0.5)  # 1 of 2 lines
    assert per.loc["planted", "off_language_client"] == 1
    assert per.loc["clean", "language_compliance_client"] == 1.0
    assert per.loc["planted", "language_compliance_responder"] == 1.0
    assert "Language compliance" in (run / "eval" / "report.html").read_text()


@pytest.mark.e2e
def test_a_spanish_persona_expects_spanish(tmp_path: Path) -> None:
    written = write_run(
        tmp_path / "written",
        [{"persona_id": "p0", "card": "Una oficinista."}],
        [{"dialogue_id": "d", "persona_id": "p0", "texts": [SPANISH, ENGLISH[1]]}],
    )
    # The bundled persona schema has no language field yet: a dataset in the same layout
    # (Parquet files, no manifest) that carries one, as a corpus of another language would.
    run = tmp_path / "run"
    run.mkdir()
    for table in ("personas", "dialogues", "turns"):
        frame = pd.read_parquet(written / f"{table}.parquet")
        if table == "personas":
            frame = frame.assign(language="es")
        frame.to_parquet(run / f"{table}.parquet")
    m = evaluate(run, embedder="lookup", progress=False)
    assert m.language is not None and m.language.expected == ["es"]
    assert [f.speaker for f in m.language.flagged] == ["responder"]  # English is off-language here
