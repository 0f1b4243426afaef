"""`spasm eval --dry-run` (what a corpus costs before it runs), the embedding bar's units and
`--device`: real runs written through the store, the real local embedder, the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from spasm.cli import main
from spasm.dataset.synthetic import synthesize_run
from spasm.evaluation import evaluate
from spasm.evaluation.embeddings import LocalOnnxEmbedder
from spasm.evaluation.plan import eval_plan


def _files(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


@pytest.mark.e2e
def test_dry_run_counts_what_the_evaluation_embeds_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = synthesize_run(tmp_path / "run", n_dialogues=8, n_personas=4)
    before = _files(run)
    assert main(["eval", str(run), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert _files(run) == before and not (run / "eval").exists()  # nothing written, no cache
    plan = eval_plan(run)
    assert plan.dialogues == 8 and plan.utterances == 8 * 9 and plan.cached == 0
    assert plan.to_embed == plan.unique == sum(plan.sources.values())
    assert plan.sampled > 0 and plan.rate is not None and plan.expected_seconds is not None
    assert f"{plan.unique:,} unique" in out and f"{plan.to_embed:,} to embed" in out
    assert "texts/s, measured now on" in out and "Expected embedding time:" in out

    # The real evaluation embeds exactly the texts the dry run counted, with the bar in sentences.
    evaluate(run, progress=True)
    assert "sentences/s" in capsys.readouterr().err
    counts = json.loads((run / "eval" / "metrics.json").read_text())["counts"]
    assert counts["texts_embedded"] == plan.to_embed

    # Once cached, nothing is left to embed, and nothing is timed.
    again = eval_plan(run)
    assert (again.unique, again.cached, again.to_embed, again.sampled) == (plan.unique, plan.unique, 0, 0)
    assert main(["eval", str(run), "--dry-run"]) == 0
    assert "0 to embed" in capsys.readouterr().out


@pytest.mark.e2e
def test_dry_run_without_cards_and_in_probe_mode_says_what_it_cannot_count(tmp_path: Path) -> None:
    run = synthesize_run(tmp_path / "run", n_dialogues=4, n_personas=2)
    card = eval_plan(run, embedder="static", sample=8)
    centroid = eval_plan(run, embedder="static", retrieval="centroid", mode="probe", sample=8)
    assert "persona cards" in card.sources and "persona cards" not in centroid.sources
    assert "persona anchors" not in centroid.sources
    assert any("Probe mode" in n for n in centroid.notes) and not card.notes


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["eval", "{tmp}/nope", "--dry-run"], "does not exist"),
        (["eval", "{run}", "--dry-run", "--embedder", "nope"], "--embedder must be one of"),
        (["eval", "{run}", "--dry-run", "--device", "tpu"], "--device must be cpu or cuda"),
        (["eval", "{run}", "--dry-run", "--device", "cuda", "--embedder", "static"],
         "applies to --embedder local and sentence-transformers"),
        (["eval", "{run}", "--dry-run", "--own-ngram", "1"], "--own-ngram must be at least 2"),
    ],
)
def test_bad_flags_exit_2_with_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    run = synthesize_run(tmp_path / "run", n_dialogues=2, n_personas=1)
    assert main([a.format(tmp=tmp_path, run=run) for a in argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def _cuda_provider() -> bool:
    import onnxruntime as ort

    return "CUDAExecutionProvider" in ort.get_available_providers()


@pytest.mark.skipif(_cuda_provider(), reason="onnxruntime's CUDA provider is installed here")
def test_device_cuda_without_the_provider_names_the_gpu_extra(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = synthesize_run(tmp_path / "run", n_dialogues=2, n_personas=1)
    with pytest.raises(Exception, match=r"spasm\[gpu\]"):
        LocalOnnxEmbedder(device="cuda").embed(["hello there"])
    assert main(["eval", str(run), "--device", "cuda", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "spasm[gpu]" in err and "--device cpu" in err and "Traceback" not in err


@pytest.mark.skipif(not _cuda_provider(),
                    reason="no GPU here: onnxruntime's CUDA provider is not installed (pip install "
                    "'spasm[gpu]' on a machine with an NVIDIA GPU)")
def test_cuda_vectors_match_the_cpu() -> None:
    texts = ["I have been feeling anxious about my job lately.", "ok", "What would you do next? " * 12]
    cpu = LocalOnnxEmbedder().embed(texts)
    gpu = LocalOnnxEmbedder(device="cuda").embed(texts)
    assert np.min(np.sum(cpu * gpu, axis=1)) >= 0.999
