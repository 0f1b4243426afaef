"""`spasm eval --ray` on a local Ray cluster of two one-CPU workers, against the same run
evaluated locally: the embedding stage (each worker with its own session of the real local
embedder), and the per-dialogue stages (realism, language, the echoing rule and an LLM judge
on a test server) on shards of the dialogues, byte-identical to a local evaluation."""

from __future__ import annotations

import hashlib
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
from spasm.testing.server import TestServer, default_reply

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
    assert "Embedding on Ray: 2 workers;" in capsys.readouterr().err
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


def _judge_reply(body: dict[str, Any]) -> str:
    """The echoing judge: echoing (by the Client, quoting its first line) for about half the
    dialogues, by a digest of the conversation, so every shard has verdicts of both kinds."""
    system = str(body["messages"][0]["content"])
    if "ECHOING" not in system:
        return default_reply(body)
    user = str(body["messages"][-1]["content"])
    first = user.split("CLIENT: ", 1)[1].split("\n", 1)[0] if "CLIENT: " in user else ""
    if hashlib.sha256(user.encode()).digest()[0] % 2:
        return json.dumps({"echoing": True, "who": "client", "evidence": [first[:60]]})
    return json.dumps({"echoing": False, "who": "none", "evidence": []})


def _judged(run: Path) -> pd.DataFrame:
    return pd.read_parquet(run / "calls.parquet").query("role == 'eval_judge'")


def _stable(metrics: dict[str, Any]) -> dict[str, Any]:
    """metrics.json without what differs between two evaluations of two copies of a run."""
    return {k: v for k, v in metrics.items() if k not in ("timings", "created_at", "run_dir")}


def test_per_dialogue_stages_on_ray_are_byte_identical_to_a_local_run(
    ray_cluster: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    local = synthesize_run(tmp_path / "local", n_dialogues=12, n_personas=3)
    distributed = tmp_path / "ray"
    shutil.copytree(local, distributed)
    with TestServer(reply=_judge_reply) as srv:
        flags = ["--embedder", "static", "--judge", "--llm-base-url", srv.base_url,
                 "--llm-model", "judge-m", "--llm-api-key-env", "none", "--no-progress"]
        assert main(["eval", str(local), *flags]) == 0
        sent_local = len(srv.requests)
        assert main(["eval", str(distributed), *flags, "--ray"]) == 0
        assert "the echoing judge in 2 shards of the dialogues" in capsys.readouterr().err
        sent = len(srv.requests)
        assert sent - sent_local == sent_local > 0  # the same calls, from the Ray tasks
        b = json.loads((distributed / "eval" / "metrics.json").read_text())
        # A rerun on Ray is answered from the run's cache (read through the driver's node).
        assert main(["eval", str(distributed), *flags, "--ray"]) == 0
        assert len(srv.requests) == sent

    for name in ("per_dialogue.parquet", "per_turn.parquet"):
        assert (local / "eval" / name).read_bytes() == (distributed / "eval" / name).read_bytes(), name
    a = json.loads((local / "eval" / "metrics.json").read_text())
    assert _stable(a) == _stable(b) and a["llm"]["calls"] == len(ca := _judged(local)) > 0
    rerun = json.loads((distributed / "eval" / "metrics.json").read_text())
    assert rerun["llm"]["cache_hits"] == rerun["llm"]["calls"] == a["llm"]["calls"]
    frame = pd.read_parquet(local / "eval" / "per_dialogue.parquet")
    assert set(frame["echo_method"]) == {"judge"} and frame["echoing"].nunique() == 2
    assert frame["mattr_client"].notna().all() and frame["language_expected"].notna().all()
    assert a["echoing"]["judge_calls"] == len(frame) and a["echoing"]["judge_fallbacks"] == 0

    # The tasks' calls are in the run's call log like a local run's: one per dialogue and pass,
    # the same requests, unique call ids numbered per dialogue.
    cb = _judged(distributed)
    assert len(cb) == 2 * len(ca) == 2 * len(frame) and cb["call_id"].is_unique
    assert sorted(cb["request_hash"]) == sorted(list(ca["request_hash"]) * 2)
    assert set(cb["cache_hit"]) == {False, True}
    assert all(cid.startswith("eval-") and cid.endswith("#0001") for cid in cb["call_id"])


def test_the_openai_embedders_requests_on_ray_workers_are_rows_of_the_runs_calls_table(
    ray_cluster: Any, tmp_path: Path,
) -> None:
    local = synthesize_run(tmp_path / "local", n_dialogues=6, n_personas=3)
    distributed = tmp_path / "ray"
    shutil.copytree(local, distributed)
    with TestServer() as srv:
        flags = ["--embedder", "openai", "--embedding-model", "embed-m", "--embedding-base-url",
                 srv.base_url, "--embedding-api-key-env", "none", "--no-progress"]
        assert main(["eval", str(local), *flags]) == 0
        sent_local = srv.stats["requests"]
        assert main(["eval", str(distributed), *flags, "--ray"]) == 0
        sent = srv.stats["requests"] - sent_local
    rows = pd.read_parquet(distributed / "calls.parquet").query("role == 'eval_embed'")
    # Each worker's requests, brought back to the driver: one ok row per request, ids unique
    # (each worker numbers its own: embed-<time>-w<i>:run#<seq>).
    assert len(rows) == sent >= 2 and set(rows["outcome"]) == {"ok"} and rows["call_id"].is_unique
    assert {cid.split(":")[0].rsplit("-", 1)[1] for cid in rows["call_id"]} == {"w0", "w1"}
    ours = pd.read_parquet(local / "calls.parquet").query("role == 'eval_embed'")
    assert len(ours) == sent_local and rows["prompt_tokens"].sum() == ours["prompt_tokens"].sum()
