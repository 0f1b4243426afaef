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
    assert dialogues.loc["P-001-C-0001", "condition"] == "ecp"  # from the option default
    assert dialogues.loc["P-001-C-0001", "pairing"] == "gpt/gpt"
    assert dialogues.loc["P-002-C-0003", "condition"] == "concat"  # from the record itself
    assert dialogues.loc["P-002-C-0003", "pairing"] == "gpt/deepseek"
    assert list(dialogues["conversation_index"]) == [0, 1, 0]
    assert set(dialogues["status"]) == {"ok"}

    turns = pd.read_parquet(run / "turns.parquet")
    assert set(turns["speaker"]) == {"client", "responder"}
    first = turns[turns["dialogue_id"] == "P-001-C-0002"].sort_values("turn_index")
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
        ("not json", "bad.jsonl:1 is not valid JSON"),
        ('{"persona_id": "p", "conversation_id": true, "turns": []}', "conversation_id must be"),
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


def _release(tmp_path: Path, n_personas: int = 3, k: int = 4, repeat: bool = False) -> Path:
    """A file shaped like the public SPASM release: conversation_id 0..k-1 within each persona."""
    lines = []
    for p in range(n_personas):
        fields = {"name": f"N{p}", "age": 30 + p, "occupation": "nurse", "location": "Leeds",
                  "interaction_domain": "retirement savings", "emotion": "anxious",
                  "emotion_intensity": "mild", "concerns": [f"concern {p}"], "motivation": "m",
                  "style": {"verbosity": "chatty", "formality": "casual"}, "hobby": "chess"}
        for c in range(k):
            turns = [{"speaker": "client" if t % 2 == 0 else "tested", "turn_index": t,
                      "text": f"persona {p} conversation {c} turn {t}"} for t in range(4)]
            lines.append(json.dumps({"persona_id": f"P{p}", "conversation_id": c,
                                     "persona_fields": fields,
                                     "persona_description": f"You are persona {p}.",
                                     "turns": turns, "termination_reason": "natural"}))
    if repeat:
        lines.append(lines[1])
    src = tmp_path / "release.jsonl"
    src.write_text("\n".join(lines) + "\n")
    return src


def test_the_release_layout_imports_with_conversation_ids_per_persona_and_evaluates(tmp_path: Path) -> None:
    src = _release(tmp_path)
    summary = import_spasm_jsonl(src, tmp_path / "run")
    assert summary["counts"] == {"personas": 3, "dialogues": 12, "turns": 48}
    dialogues = pd.read_parquet(tmp_path / "run" / "dialogues.parquet")
    assert sorted(dialogues.conversation_index.unique()) == [0, 1, 2, 3]
    assert dialogues.dialogue_id.is_unique and "P1-k2" in set(dialogues.dialogue_id)
    personas = pd.read_parquet(tmp_path / "run" / "personas.parquet").set_index("persona_id")
    assert personas.loc["P1", "first_name"] == "N1" and personas.loc["P1", "city"] == "Leeds"
    assert personas.loc["P1", "concern"] == "concern 1" and personas.loc["P1", "intensity"] == "mild"
    assert json.loads(personas.loc["P1", "persona_fields"])["hobby"] == "chess"  # kept verbatim
    m = evaluate(tmp_path / "run", embedder="lookup", write=False, progress=False)
    assert m.counts.dialogues_ok == 12 and m.counts.personas == 3
    back = tmp_path / "back.jsonl"
    assert export_spasm_jsonl(tmp_path / "run", back) == 12
    assert [json.loads(line)["conversation_id"] for line in back.read_text().splitlines()][:4] == [0, 1, 2, 3]


def test_a_real_duplicate_persona_and_conversation_pair_is_refused_with_its_line(tmp_path: Path) -> None:
    src = _release(tmp_path, n_personas=2, k=3, repeat=True)
    message = r"release.jsonl:7 repeats persona_id 'P0' with conversation_id 1 \(first on line 2\)"
    with pytest.raises(UserError, match=message):
        import_spasm_jsonl(src, tmp_path / "run")
    assert not (tmp_path / "run").exists() and not list(tmp_path.glob(".run*"))


def test_importer_fixtures_and_generator_produce_the_same_persona_columns(tmp_path: Path) -> None:
    import anyio

    from spasm.dataset.synthetic import synthesize_run
    from spasm.engine import Engine
    from spasm.testing import TestServer
    from tests.conftest import config_from, endpoint_config

    import_spasm_jsonl(_release(tmp_path), tmp_path / "imported")
    synthesize_run(tmp_path / "synthetic", n_dialogues=4, n_personas=2)
    with TestServer() as srv:
        anyio.run(Engine(config_from(endpoint_config(srv.base_url, personas={"n": 1})),
                         tmp_path / "generated", progress=False).run)
    columns = [list(pd.read_parquet(tmp_path / name / "personas.parquet").columns)
               for name in ("imported", "synthetic", "generated")]
    assert columns[0] == columns[1] == columns[2]
    assert "first_name" in columns[0] and "name" not in columns[0]
