"""Test doubles for evaluation: an embedder whose vectors the test chooses.

Not for real use: its vectors carry no meaning beyond what a test assigns. Register it
like a real embedder (``register_embedder("lookup", LookupEmbedder)``) and pass
``embedder="lookup"`` with ``embedder_options={"table": {...}}``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from spasm.evaluation.embeddings import FloatArray, l2_normalise

__all__ = ["LookupEmbedder"]


class LookupEmbedder:
    """Returns the vector a test assigned to each text; any other text gets a fixed
    pseudo-random unit vector derived from its sha256 (so unrelated texts are nearly
    orthogonal in high dimension)."""

    __test__ = False  # not a pytest test class

    def __init__(
        self,
        *,
        table: Mapping[str, npt.ArrayLike] | None = None,
        dim: int = 64,
        name: str = "lookup",
    ) -> None:
        self.dim = dim
        self.table: dict[str, FloatArray] = {
            k: l2_normalise(np.asarray(v, dtype=np.float32))[0] for k, v in (table or {}).items()
        }
        # The name keys the embedding cache, so it must change with the vectors.
        digest = hashlib.sha256(repr((dim, sorted((k, v.tobytes()) for k, v in self.table.items()))).encode())
        self.name = f"{name}:{dim}:{digest.hexdigest()[:12]}"
        self.calls: list[list[str]] = []

    def _vector(self, text: str) -> FloatArray:
        if text in self.table:
            return self.table[text]
        seed = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "little")
        vector: FloatArray = l2_normalise(np.random.default_rng(seed).standard_normal(self.dim))[0]
        return vector

    def embed(self, texts: list[str]) -> FloatArray:
        """Vectors for ``texts`` (recorded in :attr:`calls`)."""
        self.calls.append(list(texts))
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([self._vector(t) for t in texts]).astype(np.float32)
