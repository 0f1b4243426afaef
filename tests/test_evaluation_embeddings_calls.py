"""The OpenAI embedder on spasm's one call path (:meth:`spasm.calls.Caller.embed`): the real
``openai`` SDK against the loopback test server's ``/v1/embeddings``, a failed request retried
and logged attempt by attempt, a 429 waited out, a server that never answers given up on, and
no API key in any row or file. ``spasm eval`` and ``evaluate()`` append the embedder's rows
(role ``eval_embed``) to the run's ``calls`` table, read back here with pyarrow: one row per
request sent, none for texts the embedding cache answers, none for an embedder that sends no
request, and the attempts of a failed evaluation too."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spasm.cli import main
from spasm.dataset.lock import lock_holder
from spasm.dataset.store import RunStore
from spasm.dataset.synthetic import synthesize_run
from spasm.errors import RunError
from spasm.evaluation import evaluate
from spasm.evaluation.embeddings import OpenAIEmbedder
from spasm.testing import FaultPlan, TestServer
from spasm.testing.server import embed as server_embed

KEY_ENV = "SPASM_TEST_EMBED_KEY"
KEY = "sk-test-embed-key-7f3a9c"  # stands in for a real key: it must appear nowhere


def _calls(run: Path) -> pa.Table | None:
    """The run's ``calls`` table as pyarrow reads its committed parts (``None``: no table)."""
    return pq.read_table(run / "calls.parquet") if (run / "calls.parquet").is_dir() else None


def _files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def _seed(first_fails: float) -> int:
    """A fault seed whose first draw is a fault (below ``first_fails``) and whose second is not:
    the server's outcome of request k is ``plan.pick(Random(seed).random())``, draw k."""
    for seed in range(1000):
        rng = random.Random(seed)
        if rng.random() < first_fails <= rng.random():
            return seed
    raise AssertionError("no such seed")


def _embedder(server: TestServer, **options: object) -> OpenAIEmbedder:
    return OpenAIEmbedder(model="embed-m", base_url=server.base_url, api_key_env=KEY_ENV,
                          batch_size=2, sleep_scale=0.0, **options)  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)


def test_a_failed_request_is_retried_and_each_attempt_is_a_call_row(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    texts = ["the cat sat", "a dog barked loudly", "tea"]
    with TestServer(FaultPlan(rate_500=0.5, seed=_seed(0.5))) as server:
        emb = _embedder(server)
        with caplog.at_level(logging.WARNING, logger="spasm"):
            vectors = emb.embed(texts)
        stats = server.stats
    expected = np.asarray([server_embed(t) for t in texts], dtype=np.float32)
    np.testing.assert_allclose(vectors, expected, atol=1e-5)
    # Two batches (2 + 1 texts); the first request got a 500 and was sent again.
    assert stats["500"] >= 1 and stats["requests"] == 2 + stats["500"]
    rows = emb.records
    assert [r.outcome for r in rows].count("server_error") == stats["500"]
    assert [r.outcome for r in rows].count("ok") == 2
    first, second = rows[0], rows[1]
    assert (first.attempt, first.outcome) == (1, "server_error") and "500" in (first.error or "")
    assert (second.attempt, second.outcome) == (2, "ok") and second.error is None
    assert {r.role for r in rows} == {"eval_embed"} and {r.backend for r in rows} == {"embeddings"}
    assert {r.model for r in rows} == {"embed-m"}
    assert second.resolved_model == "embed-m-testserver" and second.prompt_tokens == 7
    assert first.request_hash == second.request_hash  # the same request, sent again
    assert len({r.call_id for r in rows}) == len(rows)
    assert "are being retried" in caplog.text  # said once, not silent
    # The rows are call-table rows: the run format writes them and reads them back.
    store = RunStore(tmp_path / "log")
    store.create()
    store.write_batch("b1", {"calls": rows})
    written = store.read("calls")
    assert written is not None
    table = written.to_pandas()
    assert list(table["outcome"]) == [r.outcome for r in rows]
    assert set(table["params"]) == {'{"max_tokens": 0, "sample_index": 0, "seed": null, '
                                    '"structured": false, "temperature": 0}'}
    for path in (tmp_path / "log").rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path
    assert KEY not in repr(rows) and KEY not in emb.name


def test_a_429_is_waited_out_without_spending_an_attempt() -> None:
    with TestServer(FaultPlan(rate_429=0.5, retry_after_s=0.01, seed=_seed(0.5))) as server:
        emb = _embedder(server)
        emb.embed(["one two", "three"])
    first, second = emb.records
    assert (first.attempt, first.outcome) == (1, "rate_limited")
    assert (second.attempt, second.outcome) == (1, "ok")


def test_an_endpoint_that_keeps_failing_is_given_up_on_after_max_attempts() -> None:
    with TestServer(FaultPlan(rate_500=1.0)) as server:
        emb = _embedder(server, max_attempts=3)
        with pytest.raises(RunError, match=r"embeddings endpoint .* failed for model 'embed-m'"):
            emb.embed(["a text"])
        assert server.stats["requests"] == 3
    assert [(r.attempt, r.outcome) for r in emb.records] == [
        (1, "server_error"), (2, "server_error"), (3, "server_error")]


def test_an_evaluation_with_the_openai_embedder_writes_no_key(tmp_path: Path) -> None:
    run = synthesize_run(tmp_path / "run", n_dialogues=4, n_personas=2)
    with TestServer() as server:
        metrics = evaluate(run, embedder="openai", progress=False, embedder_options={
            "model": "embed-m", "base_url": server.base_url, "api_key_env": KEY_ENV})
        assert server.stats["requests"] >= 1
    assert metrics.embedder.startswith("openai:") and metrics.embedder.endswith(":embed-m")
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "metrics.json" for p in files)
    for path in files:
        assert KEY.encode() not in path.read_bytes(), path


def _embed_rows(table: pa.Table | None) -> list[dict[str, object]]:
    rows = [] if table is None else table.to_pylist()
    return [r for r in rows if r["role"] == "eval_embed"]


def test_spasm_eval_appends_one_call_row_per_embeddings_request_to_the_runs_calls_table(
    tmp_path: Path,
) -> None:
    run = synthesize_run(tmp_path / "run", n_dialogues=4, n_personas=2)
    before = _calls(run)
    with TestServer() as server:
        argv = ["eval", str(run), "--embedder", "openai", "--embedding-model", "embed-m",
                "--embedding-base-url", server.base_url, "--embedding-api-key-env", KEY_ENV,
                "--no-progress"]
        assert main(argv) == 0
        sent = server.requests
        assert len(sent) == server.stats["requests"] >= 1
        rows = _embed_rows(_calls(run))
        # One row per request sent (no faults: each batch once), ok, with the server's tokens.
        assert len(rows) == len(sent)
        assert {r["outcome"] for r in rows} == {"ok"} and {r["attempt"] for r in rows} == {1}
        assert [r["prompt_tokens"] for r in rows] == [
            sum(len(t.split()) for t in body["input"]) for body in sent]
        assert {r["model"] for r in rows} == {"embed-m"}
        assert {r["resolved_model"] for r in rows} == {"embed-m-testserver"}
        assert {r["backend"] for r in rows} == {"embeddings"} and not any(r["cache_hit"] for r in rows)
        assert len({r["call_id"] for r in rows}) == len(rows)
        texts = sum(len(body["input"]) for body in sent)
        metrics = json.loads((run / "eval" / "metrics.json").read_text())
        assert texts == metrics["counts"]["texts_embedded"] > 0
        # Every other row of the table is as it was before the evaluation.
        others = [] if before is None else before.to_pylist()
        assert [r for r in _calls(run).to_pylist() if r["role"] != "eval_embed"] == others  # type: ignore[union-attr]

        # Again, with every text in the embedding cache: no request, so no row.
        table = _files(run / "calls.parquet")
        assert main(argv) == 0
        assert server.stats["requests"] == len(sent)
        assert _files(run / "calls.parquet") == table
    # The local embedder sends no request: the calls table is untouched.
    assert main(["eval", str(run), "--no-progress", "--out", str(tmp_path / "local")]) == 0
    assert _files(run / "calls.parquet") == table
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path


def test_evaluate_logs_the_embedders_requests_and_only_this_evaluations(tmp_path: Path) -> None:
    runs = [synthesize_run(tmp_path / f"run{i}", n_dialogues=2, n_personas=1, seed=i) for i in (1, 2)]
    with TestServer() as server:
        emb = _embedder(server)
        evaluate(runs[0], embedder=emb, progress=False, write=False)
        first = len(emb.records)
        assert first == server.stats["requests"] >= 1
        evaluate(runs[1], embedder=emb, progress=False, write=False)  # the same object, reused
        second = len(emb.records) - first
        assert second == server.stats["requests"] - first >= 1
    ids = [[r["call_id"] for r in _embed_rows(_calls(run))] for run in runs]
    assert ids == [[r.call_id for r in emb.records[:first]], [r.call_id for r in emb.records[first:]]]
    assert not (runs[0] / "eval" / "metrics.json").exists()  # write=False: the rows, no files


def test_the_attempts_of_an_evaluation_whose_embedder_failed_are_logged(tmp_path: Path) -> None:
    run = synthesize_run(tmp_path / "run", n_dialogues=2, n_personas=1)
    with TestServer(FaultPlan(rate_500=1.0)) as server:
        emb = _embedder(server, max_attempts=2)
        with pytest.raises(RunError, match="failed for model 'embed-m'"):
            evaluate(run, embedder=emb, progress=False)
        assert server.stats["requests"] == 2
    rows = _embed_rows(_calls(run))
    assert [(r["attempt"], r["outcome"]) for r in rows] == [(1, "server_error"), (2, "server_error")]
    assert lock_holder(run) is None  # the run's write lock was released
