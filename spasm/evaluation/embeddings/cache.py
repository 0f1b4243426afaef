"""The embeddings cache: vectors keyed by (embedder name, sha256 of the text), stored as
append-only shard files inside the run directory, and the embedder that reads it first."""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from spasm.dataset.files import atomic_write
from spasm.evaluation.embeddings.base import Embedder, FloatArray

__all__ = ["CachedEmbedder", "EmbeddingCache", "text_key"]


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
