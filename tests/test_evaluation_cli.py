"""`spasm eval`, `spasm compare` and `spasm import` end to end, plus the public API."""

from __future__ import annotations

import base64
import json
import re
import shutil
from html import escape
from pathlib import Path

import pandas as pd
import pytest

import spasm.dataset.synthetic
import spasm.evaluation
from spasm.dataset.synthetic import synthesize_run
from spasm.errors import UserError
from spasm.evaluation.figures import read_figures
from tests.eval_cli import eval_cli

SAMPLE = Path(__file__).parent / "data" / "spasm_release_sample.jsonl"


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthesize_run(tmp_path_factory.mktemp("eval") / "run", n_dialogues=48, n_personas=6)


@pytest.mark.e2e
def test_eval_writes_metrics_and_a_report_with_its_figures(
    small_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert eval_cli(["eval", str(small_run), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "Evaluated 48 dialogues" in out and "report.html" in out

    metrics = json.loads((small_run / "eval" / "metrics.json").read_text())
    assert metrics["schema_version"] == 1 and metrics["mode"] == "cheap"
    assert metrics["embedder"] == "local:all-MiniLM-L6-v2-onnx-int8"
    assert metrics["counts"]["dialogues_ok"] == 48
    assert {c["pairing"] for c in metrics["drift"]["comparisons"]} == {"all", "gpt/gpt", "gpt/deepseek"}
    assert len(metrics["separability"]) == 4 and len(metrics["echoing"]["rates"]) == 4

    html = (small_run / "eval" / "report.html").read_text()
    images = re.findall(r'<img [^>]*src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)
    assert len(images) == 6  # drift, map, acc, echo, echo onset, forest plot
    assert all(base64.b64decode(img)[:8] == b"\x89PNG\r\n\x1a\n" for img in images)
    figures = read_figures(small_run / "eval")  # the same figures as data, for the viewer
    assert [f.png_base64 for f in figures] == images and all(escape(f.caption) in html for f in figures)
    assert {"drift", "map", "acc", "echo"} <= {f.name for f in figures}
    assert "http://" not in html and "https://" not in html  # self-contained

    per_dialogue = pd.read_parquet(small_run / "eval" / "per_dialogue.parquet")
    assert len(per_dialogue) == 48 and {"drift_utterance", "echoing", "pca_x"} <= set(per_dialogue)
    assert list((small_run / "eval" / "embeddings-cache").rglob("shard-*.npz"))


@pytest.mark.e2e
def test_compare_prints_the_tables(small_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if not (small_run / "eval" / "metrics.json").exists():
        eval_cli(["eval", str(small_run), "--no-progress"])
        capsys.readouterr()
    assert eval_cli(["compare", str(small_run)]) == 0
    out = capsys.readouterr().out
    assert "ECP vs CONCAT" in out and "ΔDrift" in out and "Acc@1" in out
    assert "gpt/deepseek" in out


@pytest.mark.e2e
def test_compare_computes_missing_metrics(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    assert eval_cli(["import", str(SAMPLE), "--out", str(run), "--pairing", "a/b"]) == 0
    assert "Imported 3 dialogues" in capsys.readouterr().out
    assert eval_cli(["compare", str(run), "--no-progress"]) == 0
    assert (run / "eval" / "metrics.json").exists()
    assert "no pairs" in capsys.readouterr().out  # one ECP/CONCAT pair is missing its partner


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["eval", "{missing}"], "does not exist"),
        (["eval", "{run}", "--mode", "fancy"], "--mode must be cheap or probe"),
        (["eval", "{run}", "--embedder", "bert"], "--embedder must be one of"),
        (["eval", "{run}", "--retrieval", "knn"], "--retrieval must be card or centroid"),
        (["eval", "{run}", "--judge"], "no config.json (an imported run?)"),
        (["eval", "{run}", "--mode", "probe", "--llm-backend", "gpt"], "not a backend of"),
        (["eval", "{empty}"], "personas.parquet does not exist"),
        (["import", "{missing}", "--out", "{run}"], "does not exist"),
    ],
)
def test_bad_input_is_a_user_error(small_run: Path, tmp_path: Path, argv: list[str], message: str) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    subst = {"missing": str(tmp_path / "nope"), "run": str(small_run), "empty": str(empty)}
    with pytest.raises(UserError, match=re.escape(message)):
        eval_cli([a.format(**subst) for a in argv])


def test_missing_table_column_is_a_user_error(tmp_path: Path) -> None:
    # A foreign dataset: plain Parquet files (no commit markers) whose turns lack columns.
    run = synthesize_run(tmp_path / "run", n_dialogues=4, n_personas=2)
    for table in ("personas", "dialogues"):
        df = pd.read_parquet(run / f"{table}.parquet")
        shutil.rmtree(run / f"{table}.parquet")
        df.to_parquet(run / f"{table}.parquet")
    shutil.rmtree(run / "turns.parquet")
    shutil.rmtree(run / ".commits")
    pd.DataFrame({"dialogue_id": ["x"]}).to_parquet(run / "turns.parquet")
    with pytest.raises(UserError, match="lacks the column"):
        eval_cli(["eval", str(run)])


def test_public_api() -> None:
    expected = {
        "CachedEmbedder",
        "Conversation",
        "Embedder",
        "EmbeddingCache",
        "LocalOnnxEmbedder",
        "Metrics",
        "OpenAIEmbedder",
        "RunData",
        "SentenceTransformerEmbedder",
        "available_embedders",
        "comparison_text",
        "create_embedder",
        "evaluate",
        "export_spasm_jsonl",
        "import_spasm_jsonl",
        "load_metrics",
        "load_run",
        "register_embedder",
        "render_report",
        "write_report",
    }
    assert set(spasm.evaluation.__all__) == expected
    for name in expected:
        assert getattr(spasm.evaluation, name).__doc__, f"{name} needs a docstring"
    with pytest.raises(AttributeError):
        spasm.evaluation.nothing_here  # noqa: B018


def test_main_cli_turns_user_errors_into_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from spasm.cli import main
    assert main(["eval", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.e2e
def test_tables_as_part_directories_and_no_ok_dialogue(tmp_path: Path) -> None:
    """Runs store tables as directories of part files; a run with only failed dialogues
    still evaluates (empty figures, notes) instead of crashing."""
    flat = synthesize_run(tmp_path / "flat", n_dialogues=4, n_personas=2)
    run = tmp_path / "parts"
    for table in ("personas", "dialogues", "turns"):
        df = pd.read_parquet(flat / f"{table}.parquet")
        (run / f"{table}.parquet").mkdir(parents=True)
        half = len(df) // 2
        df.iloc[:half].to_parquet(run / f"{table}.parquet" / "part-0.parquet")
        df.iloc[half:].to_parquet(run / f"{table}.parquet" / "part-1.parquet")
    m = spasm.evaluation.evaluate(run, progress=False)
    assert m.counts.dialogues_ok == 4 and m.counts.utterances == 36

    failed = tmp_path / "failed"
    spasm.dataset.synthetic.write_run(failed, [{"persona_id": "p1", "card": "A person."}], [
        {"dialogue_id": f"d{i}", "persona_id": "p1", "status": "error", "texts": ["a", "b"]}
        for i in range(4)
    ])
    flat = failed
    m = spasm.evaluation.evaluate(flat, progress=False)
    assert m.counts.dialogues_ok == 0 and m.counts.dialogues_total == 4
    assert m.echoing.overall.rate is None and m.separability == [] and m.drift.notes
    assert (flat / "eval" / "report.html").read_text().count("data:image/png;base64,") == 6
