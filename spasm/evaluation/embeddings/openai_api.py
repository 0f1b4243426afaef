"""Any OpenAI-compatible ``/v1/embeddings`` endpoint (OpenAI, vLLM, Ollama, ...)."""

from __future__ import annotations

import numpy as np

from spasm.errors import RunError, UserError
from spasm.evaluation.embeddings.base import FloatArray, l2_normalise, register_embedder
from spasm.redact import redact_url

__all__ = ["OpenAIEmbedder"]


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


register_embedder("openai", OpenAIEmbedder)
