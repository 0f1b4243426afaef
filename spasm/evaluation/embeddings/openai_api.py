"""Any OpenAI-compatible ``/v1/embeddings`` endpoint (OpenAI, vLLM, Ollama, ...), reached through
spasm's one call path (:meth:`spasm.calls.Caller.embed`): the SDK's retries off, the call path's
retries, pacing (``x-ratelimit-*``, 429s waited out) and budget on, and every attempt a row of
the embedder's call log (:attr:`OpenAIEmbedder.records`, role ``eval_embed``), which
``spasm eval`` appends to the run's ``calls`` table (tests/test_evaluation_embeddings_calls.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import TypeVar

import anyio
import numpy as np

from spasm.backends import make_backend
from spasm.backends.base import EmbeddingRequest
from spasm.backends.keys import resolve_api_key
from spasm.calls import Caller, CallScope
from spasm.config import BackendConfig
from spasm.dataset.rows import CallRow
from spasm.errors import BackendError, MalformedResponseError, RunError, UserError
from spasm.evaluation.embeddings.base import FloatArray, l2_normalise, register_embedder
from spasm.redact import redact_url

__all__ = ["EMBED_ROLE", "OpenAIEmbedder", "embed_call_prefix"]

#: The ``calls.role`` of an embeddings request.
EMBED_ROLE = "eval_embed"
#: The backend name of the embedder's requests (``calls.backend``, and in retry warnings).
BACKEND_NAME = "embeddings"

R = TypeVar("R")


def embed_call_prefix(worker: int | None = None) -> str:
    """The prefix of an embedder's call ids, ``embed-<time>`` (``embed-<time>-w<worker>`` for
    a Ray worker's, so that two workers' ids never collide in the run's ``calls`` table)."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")
    return f"embed-{stamp}" if worker is None else f"embed-{stamp}-w{worker}"


def _run_sync(fn: Callable[[], Awaitable[R]]) -> R:
    """``await fn()`` from synchronous code: on a loop of its own, in a thread of its own
    when this thread already runs one (a notebook)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return anyio.run(fn)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(anyio.run, fn).result()


class OpenAIEmbedder:
    """Any OpenAI-compatible ``/v1/embeddings`` endpoint, called in batches.

    Each :meth:`embed` sends its batches one after another through a :class:`~spasm.calls.Caller`
    on a loop of its own (the SDK client lives on that loop); the call log of every request so
    far is :attr:`records`.

    Args:
        model: the embedding model name (e.g. ``text-embedding-3-large``).
        base_url: the API base URL (default: the SDK's default, i.e. OpenAI).
        api_key_env: the *name* of the environment variable holding the key; ``None``
            means the endpoint needs no key (a local vLLM or Ollama server).
        batch_size: texts per request.
        timeout: seconds per request.
        max_attempts: attempts per request (:mod:`spasm.calls`' retry policy).
        sleep_scale: scales the waits between attempts (tests use 0).
        call_prefix: the prefix of its call ids, ``<prefix>:run#<seq>`` (default
            ``embed-<time>``); ``spasm eval --ray`` gives each worker its own, so the ids stay
            unique in the run's ``calls`` table.
    """

    def __init__(
        self,
        *,
        model: str = "text-embedding-3-small",
        base_url: str | None = None,
        api_key_env: str | None = "OPENAI_API_KEY",
        batch_size: int = 256,
        timeout: float = 60.0,
        max_attempts: int = 6,
        sleep_scale: float = 1.0,
        call_prefix: str | None = None,
    ) -> None:
        # A missing key fails here, before any work; the key itself is read again by the
        # backend of each embed() and lives only inside its client: never kept, logged or written.
        resolve_api_key(api_key_env, f"embeddings ({model})")
        self.model = model
        self.base_url = base_url
        self.batch_size = batch_size
        self.sleep_scale = sleep_scale
        self._config = BackendConfig(kind="openai", model=model, base_url=base_url,
                                     api_key_env=api_key_env, timeout_s=timeout,
                                     max_attempts=max_attempts)
        # The name keys the embeddings cache (a folder) and is written to metrics.json.
        self.name = f"openai:{redact_url(base_url) if base_url else 'default'}:{model}"
        self._scope = CallScope()
        self._pass_id = call_prefix or embed_call_prefix()
        #: Whether the endpoint has answered a request (a reply it cannot read after that is a
        #: failure of the run, before it a wrong URL).
        self._answered = False

    @property
    def records(self) -> list[CallRow]:
        """The call log of every request so far: one row per attempt, as a chat call's."""
        return self._scope.records

    def embed(self, texts: list[str]) -> FloatArray:
        """Embed ``texts`` with one request per ``batch_size`` texts."""
        rows = _run_sync(lambda: self._embed(texts)) if texts else []
        if not rows:
            return np.zeros((0, 0), dtype=np.float32)
        return l2_normalise(np.asarray(rows, dtype=np.float32))

    async def _embed(self, texts: list[str]) -> list[list[float]]:
        backend = make_backend(BACKEND_NAME, self._config)
        caller = Caller({BACKEND_NAME: backend}, {BACKEND_NAME: self._config},
                        sleep_scale=self.sleep_scale)
        caller.pass_id = self._pass_id  # call ids "embed-<time>:run#<seq>", unique across calls
        where = redact_url(self.base_url or "api.openai.com")
        rows: list[list[float]] = []
        try:
            for start in range(0, len(texts), self.batch_size):
                batch = tuple(texts[start : start + self.batch_size])
                try:
                    answer = await caller.embed(EMBED_ROLE, BACKEND_NAME, EmbeddingRequest(batch),
                                                self._scope)
                except BackendError as exc:
                    if isinstance(exc, MalformedResponseError) and not self._answered:
                        raise UserError(
                            f"The embeddings endpoint {where} does not answer like an "
                            "OpenAI-compatible embeddings API (the reply is not a list of "
                            "vectors). Check --embedding-base-url: it should point at the API "
                            "(e.g. http://host:8000/v1)."
                        ) from None
                    raise RunError(
                        f"The embeddings endpoint {where} failed for model {self.model!r}: "
                        f"{redact_url(str(exc))}"
                    ) from exc
                self._answered = True
                vectors = answer.vectors
                if len(vectors) != len(batch) or len({len(v) for v in vectors}) > 1:
                    raise RunError(
                        f"The embeddings endpoint {where} returned {len(vectors)} vectors of sizes "
                        f"{sorted({len(v) for v in vectors})} for {len(batch)} texts."
                    )
                rows.extend(vectors)
        finally:
            await backend.aclose()
        return rows


register_embedder("openai", OpenAIEmbedder)
