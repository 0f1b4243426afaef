"""The static embedder: a model2vec-style distillation of the packaged MiniLM, its on-disk
table cache, and `spasm eval --embedder static` end to end.

The table is distilled from the real packaged model (about 20-35 s on the project's 2-core
machines: every vocabulary token through the ONNX model) at most once per session, into the
suite's ``$SPASM_CACHE_DIR`` (tests/conftest.py), kept in pytest's cache while the embeddings
package is unchanged; every other test reads it from there, and the tests that rebuild a table
work on a copy.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from spasm.dataset.integrity import file_sha256
from spasm.dataset.synthetic import synthesize_run
from spasm.evaluation import embeddings, evaluate
from spasm.evaluation.cli import register
from spasm.evaluation.embeddings import (
    LOCAL_MODEL_ID,
    StaticEmbedder,
    available_embedders,
    create_embedder,
    static_cache_dir,
)

pytestmark = pytest.mark.e2e

NAME = f"static:{LOCAL_MODEL_ID}-distilled-pca256"


@pytest.fixture(scope="session")
def cache_root(spasm_cache_dir: Path) -> Path:
    """The suite's ``$SPASM_CACHE_DIR`` (tests/conftest.py) holding the table distilled from the
    real model: built at most once per session and kept in pytest's cache for the next ones."""
    built = StaticEmbedder(cache_dir=spasm_cache_dir / "static-embedder")
    built.embed(["warm up"])
    assert built.table_path is not None and built.table_path.is_file()
    return spasm_cache_dir


@pytest.fixture
def static(cache_root: Path, monkeypatch: pytest.MonkeyPatch) -> StaticEmbedder:
    monkeypatch.setenv("SPASM_CACHE_DIR", str(cache_root))
    return StaticEmbedder()


@pytest.fixture
def table(static: StaticEmbedder) -> np.ndarray:
    static.embed([])
    assert static._table is not None
    return static._table


def _copy_cache(cache_root: Path, dest: Path) -> Path:
    shutil.copytree(cache_root / "static-embedder", dest)
    return dest


def test_the_table_follows_model2vecs_recipe(static: StaticEmbedder, table: np.ndarray) -> None:
    tokenizer = static._tokenizer
    assert table.shape == (tokenizer.get_vocab_size(), 256) and table.dtype == np.float32
    vocab = tokenizer.get_vocab()
    # The [unusedN] placeholders are left out (zero rows); every other token has a vector.
    unused = [i for tok, i in vocab.items() if tok.startswith("[unused")]
    assert len(unused) == 994 and not table[unused].any()
    kept = np.setdiff1d(np.arange(len(table)), unused)
    assert (np.linalg.norm(table[kept], axis=1) > 0).all()
    # PCA output is centred; the SIF weights (a / (a + p_r), p_r ~ 1/(r+1)) scale it per row.
    inv_rank = 1.0 / np.arange(2, len(kept) + 2)
    weights = 1e-4 / (1e-4 + inv_rank / inv_rank.sum())
    np.testing.assert_allclose((table[kept] / weights[:, None]).mean(axis=0), 0.0, atol=1e-4)
    assert json.loads(static.table_path.with_suffix(".json").read_text())["recipe"] == {  # type: ignore[union-attr]
        "version": 1, "template": "[CLS] token [SEP]", "pooling": "mean",
        "remove": r"\[unused\d+\]", "pca_dims": 256, "sif_coefficient": 1e-4,
    }


def test_vectors_are_unit_length_deterministic_and_in_order(static: StaticEmbedder) -> None:
    texts = [
        "My washing machine stopped spinning and it is still under warranty.",
        "What is the best way to save for retirement with a small pension?",
        "ok",
        "",
        "[CLS] [SEP]",
    ]
    vecs = static.embed(texts)
    assert vecs.shape == (5, 256) and vecs.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vecs[:3], axis=1), 1.0, atol=1e-5)
    # No token but special ones: a zero row (model2vec's behaviour), not a made-up vector.
    assert not vecs[3].any() and not vecs[4].any()
    # Special tokens typed in a text are dropped like the ones the tokenizer would add.
    np.testing.assert_array_equal(static.embed(["[CLS] ok [SEP]"])[0], vecs[2])
    # The same bytes from a new object (table read back from the cache), one text at a time,
    # and across the tokenizing batches and the token chunks of the reduction.
    again = StaticEmbedder(batch_size=2)
    np.testing.assert_array_equal(again.embed(texts), vecs)
    np.testing.assert_array_equal(np.stack([static.embed([t])[0] for t in texts]), vecs)
    assert static.embed([]).shape == (0, 256)


def test_a_text_is_the_normalised_mean_of_its_token_rows(static: StaticEmbedder, table: np.ndarray) -> None:
    ids = static._tokenizer.encode("Unbelievable weather, honestly!", add_special_tokens=False).ids
    assert len(ids) >= 5  # sub-words and punctuation are tokens too
    expected = table[ids].mean(axis=0)
    np.testing.assert_allclose(
        static.embed(["Unbelievable weather, honestly!"])[0], expected / np.linalg.norm(expected), atol=1e-6
    )
    # A repeated token counts as often as it occurs.
    word = static._tokenizer.encode("weather", add_special_tokens=False).ids
    twice = table[ids].sum(axis=0) + table[word].sum(axis=0)
    np.testing.assert_allclose(
        static.embed(["Unbelievable weather, honestly! weather"])[0], twice / np.linalg.norm(twice), atol=1e-6
    )


def test_word_order_does_not_matter(static: StaticEmbedder) -> None:
    text = "my landlord will not return the deposit after I moved out last month"
    shuffled = " ".join(np.random.default_rng(0).permutation(text.split()))
    assert shuffled != text
    a, b = static.embed([text, shuffled])
    np.testing.assert_allclose(a, b, atol=1e-6)  # a bag of tokens: a known property


PARAPHRASES = [
    ("My washing machine stopped spinning and it is still under warranty.",
     "The washer broke down; is the repair covered by the guarantee?"),
    ("I feel anxious about my exam tomorrow.", "I'm nervous about the test I have tomorrow."),
    ("Can you help me write a budget for next month?", "I need a plan for my spending in the coming month."),
    ("My dog has been limping since our walk yesterday.",
     "After yesterday's walk my puppy can't walk properly."),
    ("The train to Berlin was cancelled again.", "Again my rail connection to Berlin got cancelled."),
]


def test_paraphrases_are_closer_than_unrelated_pairs(static: StaticEmbedder) -> None:
    left = static.embed([a for a, _ in PARAPHRASES])
    right = static.embed([b for _, b in PARAPHRASES])
    sims = left @ right.T
    paraphrase = np.diag(sims)
    unrelated = sims[~np.eye(len(PARAPHRASES), dtype=bool)]
    # Every sentence is closer to its paraphrase than to any other pair's sentence.
    assert (paraphrase[:, None] > np.where(np.eye(len(sims), dtype=bool), -1, sims)).all()
    assert (paraphrase[None, :] > np.where(np.eye(len(sims), dtype=bool), -1, sims)).all()
    assert paraphrase.mean() > unrelated.mean() + 0.2


def test_a_second_embedder_reuses_the_cached_table(
    cache_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = _copy_cache(cache_root, tmp_path / "cache")
    table_file = next(cache.glob("table-*.npy"))
    before = table_file.stat().st_mtime_ns
    # The table, its sidecar and the distillation's lock file (dataset.lock.waiting_lock keeps
    # it: removing a flock's file races its next holder); reading a cached table adds nothing.
    files = sorted(p.name for p in cache.iterdir())
    assert {Path(name).suffix for name in files} <= {".json", ".npy", ".lock"}

    def no_model_run(*args: object, **kwargs: object) -> np.ndarray:
        raise AssertionError("the cached table should have been used")

    monkeypatch.setattr(embeddings.static, "distill_static_table", no_model_run)
    again = StaticEmbedder(cache_dir=cache)
    assert again.embed(["hello there"]).shape == (1, 256)
    assert not again.distilled and again.table_path == table_file
    assert again.distill_seconds is not None and again.distill_seconds > 0  # from the sidecar
    assert table_file.stat().st_mtime_ns == before
    assert sorted(p.name for p in cache.iterdir()) == files
    assert sum(name.endswith(".npy") for name in files) == 1


@pytest.mark.parametrize("damage", ["truncate", "flip", "no-sidecar", "wrong-shape"])
def test_a_damaged_cached_table_is_rebuilt(
    damage: str, cache_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = _copy_cache(cache_root, tmp_path / "cache")
    table_file = next(cache.glob("table-*.npy"))
    good = np.load(table_file)
    reference = StaticEmbedder(cache_dir=cache).embed(["the deposit was not returned"])
    raw = table_file.read_bytes()
    if damage == "truncate":
        table_file.write_bytes(raw[: len(raw) // 2])
    elif damage == "flip":  # same size, one byte changed: only the checksum notices
        table_file.write_bytes(raw[:-100] + bytes([raw[-100] ^ 0xFF]) + raw[-99:])
    elif damage == "no-sidecar":
        table_file.with_suffix(".json").unlink()
    else:  # a valid .npy of another shape, its checksum recorded as if it were right
        np.save(table_file, good[:10])
        meta = json.loads(table_file.with_suffix(".json").read_text())
        meta["table_sha256"] = file_sha256(table_file)
        table_file.with_suffix(".json").write_text(json.dumps(meta))

    calls: list[tuple[object, ...]] = []

    def distill(*args: object, **kwargs: object) -> np.ndarray:
        calls.append(args)  # stands in for the ~30 s model run; the fixture ran the real one
        return np.asarray(good)

    monkeypatch.setattr(embeddings.static, "distill_static_table", distill)
    rebuilt = StaticEmbedder(cache_dir=cache)
    np.testing.assert_array_equal(rebuilt.embed(["the deposit was not returned"]), reference)
    assert rebuilt.distilled and len(calls) == 1
    np.testing.assert_array_equal(np.load(table_file), good)  # rewritten whole
    # ...and trusted again from then on.
    third = StaticEmbedder(cache_dir=cache)
    np.testing.assert_array_equal(third.embed(["the deposit was not returned"]), reference)
    assert not third.distilled and len(calls) == 1


def test_registered_with_its_own_name_and_cache_dir(
    cache_root: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert {"local", "static"} <= set(available_embedders())
    monkeypatch.setenv("SPASM_CACHE_DIR", str(cache_root))
    emb = create_embedder("static")
    assert isinstance(emb, StaticEmbedder) and emb.name == NAME
    assert emb.cache_dir == cache_root / "static-embedder"
    other = StaticEmbedder(pca_dims=128, sif_coefficient=1e-3, cache_dir=tmp_path)
    assert other.name == f"static:{LOCAL_MODEL_ID}-distilled-pca128-sif0.001"
    monkeypatch.delenv("SPASM_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    if sys.platform.startswith("linux"):  # the platform's user cache (macOS, Windows: their own)
        assert static_cache_dir() == tmp_path / "xdg" / "spasm" / "static-embedder"


def test_evaluate_and_spasm_eval_run_end_to_end_with_it(
    cache_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SPASM_CACHE_DIR", str(cache_root))
    run_dir = synthesize_run(tmp_path / "run", n_dialogues=40, n_personas=4)
    m = evaluate(run_dir, embedder="static", progress=False)
    assert m.embedder == NAME
    assert m.counts.dialogues_ok == 40 and m.counts.texts_embedded > 0
    assert m.drift.comparisons and m.separability and m.echoing.overall.n == 40
    assert all(c.delta is not None and np.isfinite(c.delta) for c in m.drift.comparisons)

    parser = argparse.ArgumentParser(prog="spasm")
    register(parser.add_subparsers(dest="command"))
    out = tmp_path / "out"
    argv = ["eval", str(run_dir), "--embedder", "static", "--no-progress", "--out", str(out)]
    args = parser.parse_args(argv)
    assert args.func(args) == 0
    assert "Evaluated 40 dialogues" in capsys.readouterr().out
    assert json.loads((out / "metrics.json").read_text())["embedder"] == NAME
