"""The one small interface every embedder has, and the registry of embedders by name.

Every metric in :mod:`spasm.evaluation` sees text only through an :class:`Embedder`:
something with a ``name`` (which identifies the vector space, and so the cache) and an
``embed(texts) -> float32 array`` whose rows are L2-normalised. Implementations are
registered by name (:func:`register_embedder`) and built with :func:`create_embedder`,
so a test's fake embedder is chosen exactly like the real ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, overload, runtime_checkable

import numpy as np
import numpy.typing as npt

from spasm.dataset.rows import CallRow
from spasm.errors import UserError
from spasm.registry import EMBEDDERS

__all__ = [
    "Embedder",
    "EmbedderFactory",
    "FloatArray",
    "available_embedders",
    "create_embedder",
    "embedder_calls",
    "l2_normalise",
    "register_embedder",
]

FloatArray = npt.NDArray[np.float32]


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


def embedder_calls(embedder: object) -> list[CallRow]:
    """The call-log rows an embedder keeps of the requests it sent: its ``records`` (the
    ``openai`` embedder's, one row per attempt; a Ray embedder's, its workers'), none for an
    embedder that sends no request. ``spasm eval`` appends them to the run's ``calls`` table."""
    records = getattr(embedder, "records", None)
    return [r for r in records if isinstance(r, CallRow)] if isinstance(records, list) else []


def l2_normalise(matrix: npt.ArrayLike) -> FloatArray:
    """Rows scaled to unit length (zero rows stay zero), as float32."""
    arr = np.asarray(matrix, dtype=np.float32)
    if arr.ndim == 1:
        arr = arr[None, :]
    norms = np.linalg.norm(arr, axis=1, keepdims=True)
    out: FloatArray = (arr / np.clip(norms, 1e-12, None)).astype(np.float32)
    return out


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
