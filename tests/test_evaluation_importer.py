"""`spasm import`: SPASM release JSONL -> run tables, and back."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from spasm.errors import UserError
from spasm.evaluation import evaluate, export_spasm_jsonl, import_spasm_jsonl, register_embedder
from spasm.evaluation.testing import LookupEmbedder

SAMPLE = Path(__file__).parent / "data" / "spasm_release_sample.jsonl"
register_embedder("lookup", LookupEmbedder)


def test_import_writes_the_three_tables(tmp_path: Path) -> None:
    run = tmp_path / "run"
    summary = import_spasm_jsonl(SAMPLE, run, pairing="gpt/gpt")
    assert summary["counts"] == {"personas": 2, "dialogues": 3, "turns": 16}
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["source_sha256"] and manifest["defaults"]["pairing"] == "gpt/gpt"

    personas = pd.read_parquet(run / "personas.parquet").set_index("persona_id")
    p1 = personas.loc["P-001"].to_dict()
    assert p1["city"] == "Leeds" and p1["age"] == 34 and p1["intensity"] == "moderate"
    assert p1["concern"] == "whether my pension will be enough; hidden fees"
    assert p1["verbosity"] == "chatty" and p1["card"].startswith("You are a 34-year-old nurse")

    dialogues = pd.read_parquet(run / "dialogues.parquet").set_index("dialogue_id")
    assert dialogues.loc["C-0001", "condition"] == "ecp"  # from the option default
    assert dialogues.loc["C-0001", "pairing"] == "gpt/gpt"
    assert dialogues.loc["C-0003", "condition"] == "concat"  # from the record itself
    assert dialogues.loc["C-0003", "pairing"] == "gpt/deepseek"
    assert list(dialogues["conversation_index"]) == [0, 1, 0]
    assert set(dialogues["status"]) == {"ok"}

    turns = pd.read_parquet(run / "turns.parquet")
    assert set(turns["speaker"]) == {"client", "responder"}
    first = turns[turns["dialogue_id"] == "C-0002"].sort_values("turn_index")
    assert list(first["turn_index"]) == list(range(6))
    assert list(first["speaker"])[:2] == ["client", "responder"]


def test_import_then_export_round_trips(tmp_path: Path) -> None:
    run = tmp_path / "run"
    import_spasm_jsonl(SAMPLE, run)
    out = tmp_path / "back.jsonl"
    assert export_spasm_jsonl(run, out) == 3
    original = {r["conversation_id"]: r for r in map(json.loads, SAMPLE.read_text().splitlines())}
    back = {r["conversation_id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert back.keys() == original.keys()
    for cid, rec in original.items():
        for key in ("persona_id", "persona_fields", "persona_description", "turns", "termination_reason"):
            assert back[cid][key] == rec[key], (cid, key)


def test_imported_run_can_be_evaluated(tmp_path: Path) -> None:
    run = tmp_path / "run"
    import_spasm_jsonl(SAMPLE, run)
    m = evaluate(run, embedder="lookup", write=False, progress=False)
    assert m.counts.dialogues_ok == 3 and m.counts.personas == 2
    assert {d.dimension for d in m.drift.curves} == {"utterance", "concerns", "emotion", "motivation"}


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "not valid JSON"),
        ('{"persona_id": "p", "turns": []}', "no 'conversation_id'"),
        (
            '{"persona_id": "p", "conversation_id": "c", "turns": [{"speaker": "bot", "text": "x"}]}',
            "unknown speaker 'bot'",
        ),
    ],
)
def test_malformed_files_are_user_errors(tmp_path: Path, line: str, message: str) -> None:
    src = tmp_path / "bad.jsonl"
    src.write_text(line + "\n")
    with pytest.raises(UserError, match=message):
        import_spasm_jsonl(src, tmp_path / "run")


def test_import_refuses_to_overwrite_and_checks_options(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="does not exist"):
        import_spasm_jsonl(tmp_path / "missing.jsonl", tmp_path / "run")
    with pytest.raises(UserError, match="Unknown condition"):
        import_spasm_jsonl(SAMPLE, tmp_path / "run", condition="both")
    import_spasm_jsonl(SAMPLE, tmp_path / "run")
    with pytest.raises(UserError, match="--force"):
        import_spasm_jsonl(SAMPLE, tmp_path / "run")
    import_spasm_jsonl(SAMPLE, tmp_path / "run", overwrite=True)
