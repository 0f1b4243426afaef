"""`spasm eval --ray`: the embedding stage on a local Ray cluster (two one-CPU workers, each
with its own session of the real local embedder), against the same run evaluated locally."""

from __future__ import annotations

import json
import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from spasm.cli import main
from spasm.dataset.synthetic import synthesize_run
from spasm.evaluation import evaluate
from spasm.evaluation.embeddings import EmbeddingCache, text_key
from spasm.evaluation.loader import load_run

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent


def test_an_address_where_no_cluster_answers_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("ray")
    if __import__("ray").is_initialized():
        pytest.skip("a Ray is already initialised in this process")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    run = synthesize_run(tmp_path / "run", n_dialogues=2, n_personas=1)
    assert main(["eval", str(run), "--ray", f"127.0.0.1:{port}", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"no Ray cluster answers at 127.0.0.1:{port}" in err and "Traceback" not in err
    assert main(["eval", str(run), "--ray", "--device", "cuda"]) == 2
    assert "not available with --ray" in capsys.readouterr().err


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    # The test machine is shared: other processes' memory must not get the workers killed.
    os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(
                 [str(ROOT), os.environ.get("PYTHONPATH", "")])}})
    yield ray
    ray.shutdown()


_VECTOR_COLUMNS = ("drift_", "echo", "pca_", "persona_hit", "persona_silhouette")


def test_ray_evaluation_matches_the_local_one(
    ray_cluster: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    local = synthesize_run(tmp_path / "local", n_dialogues=8, n_personas=4)
    distributed = tmp_path / "ray"
    shutil.copytree(local, distributed)

    assert main(["eval", str(distributed), "--dry-run", "--ray"]) == 0
    assert "On the Ray cluster: 2 CPUs, 2 workers" in capsys.readouterr().out
    assert main(["eval", str(distributed), "--ray", "--no-progress"]) == 0
    assert "Embedding on Ray: 2 workers." in capsys.readouterr().err
    evaluate(local, progress=False)

    a = json.loads((local / "eval" / "metrics.json").read_text())
    b = json.loads((distributed / "eval" / "metrics.json").read_text())
    assert a["embedder"] == b["embedder"] == "local:all-MiniLM-L6-v2-onnx-int8"
    assert a["counts"] == b["counts"] and a["counts"]["texts_embedded"] > 0
    assert a["realism"] == b["realism"] and a["language"] == b["language"]  # offline: identical

    fa = pd.read_parquet(local / "eval" / "per_dialogue.parquet")
    fb = pd.read_parquet(distributed / "eval" / "per_dialogue.parquet")
    offline = [c for c in fa.columns if not c.startswith(_VECTOR_COLUMNS)]
    vector = [c for c in fa.columns if c.startswith(("drift_", "pca_", "persona_hit", "persona_sil",
                                                     "echo_score", "echo_client", "echo_responder"))]
    assert len(vector) >= 10 and "persona_id" in offline
    pd.testing.assert_frame_equal(fa[offline], fb[offline])
    np.testing.assert_allclose(fa[vector].to_numpy(float), fb[vector].to_numpy(float),
                               rtol=1e-3, atol=1e-4)

    # The cache both runs filled: the same texts, vectors equal to float tolerance.
    texts = sorted({t for c in load_run(local).conversations for t in c.texts})
    keys = [text_key(t) for t in texts]
    va = EmbeddingCache(local / "eval" / "embeddings-cache", a["embedder"]).get(keys)
    vb = EmbeddingCache(distributed / "eval" / "embeddings-cache", b["embedder"]).get(keys)
    assert all(v is not None for v in va + vb)
    cosines = np.sum(np.stack(va) * np.stack(vb), axis=1)  # type: ignore[arg-type]
    assert cosines.min() >= 0.9999
