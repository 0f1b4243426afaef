"""``spasm eval --ray``: the embedding stage on a Ray cluster.

:class:`RayEmbedder` is an :class:`~spasm.evaluation.embeddings.Embedder` whose ``embed`` splits
the texts over Ray actors, one per worker slot of the cluster (a CPU by default), each holding
its own session of the named embedder (built with :func:`create_embedder`, as locally, with one
onnxruntime thread per slot for ``local`` and ``static``). The texts are sorted by length and
cut into one contiguous slice per actor, so each pads as little as a local run; the vectors
come back through Ray's object store, one chunk at a time. Its ``name`` is the wrapped
embedder's, so it reads and fills the run's embedding cache (on the head node, in the run
directory) exactly like a local run, and everything after the embedding runs as it does
locally: the offline metrics are byte-identical, the vectors equal to float tolerance.

Ray is an optional extra (``pip install 'spasm[ray]'``); this module imports it only through
:mod:`spasm.raycluster`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from spasm.errors import RunError
from spasm.evaluation.embeddings import FloatArray, create_embedder

__all__ = ["RayEmbedder"]

#: Texts per actor and call: the pipeline hands ``chunk_size`` texts at a time.
TEXTS_PER_WORKER = 1024


class _Worker:
    """One Ray actor: its own session of the embedder."""

    def __init__(self, name: str, options: Mapping[str, Any]) -> None:
        self._embedder = create_embedder(name, **dict(options))

    def embed(self, texts: list[str]) -> FloatArray:
        return self._embedder.embed(texts)


class RayEmbedder:
    """The embedder ``name`` run on Ray actors (see the module docstring).

    Args:
        ray: the ``ray`` module, initialised (:func:`spasm.raycluster.ray_session`).
        name: a registered embedder name.
        options: its options (``threads`` defaults to ``cpus_per_worker`` for ``local`` and
            ``static``).
        workers: how many actors (default: the cluster's CPUs over ``cpus_per_worker``).
        cpus_per_worker: CPUs Ray reserves for each actor.

    Attributes:
        workers: the actors' count.
        chunk_size: texts the pipeline should hand over per call (``TEXTS_PER_WORKER`` each).
    """

    def __init__(
        self,
        ray: Any,
        name: str,
        options: Mapping[str, Any] | None = None,
        *,
        workers: int | None = None,
        cpus_per_worker: float = 1.0,
    ) -> None:
        opts = dict(options or {})
        if name in ("local", "static"):
            opts.setdefault("threads", max(1, int(cpus_per_worker)))
        self.name: str = create_embedder(name, **opts).name  # a missing model fails here, at once
        cpus = float(ray.cluster_resources().get("CPU", 1))
        self.workers = workers or max(1, int(cpus // cpus_per_worker))
        self.chunk_size = TEXTS_PER_WORKER * self.workers
        self._ray = ray
        actor = ray.remote(num_cpus=cpus_per_worker)(_Worker)
        self._actors = [actor.remote(name, opts) for _ in range(self.workers)]

    def embed(self, texts: list[str]) -> FloatArray:
        """Embed ``texts`` on the actors, one contiguous slice of them (by length) each."""
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        parts = [p for p in np.array_split(np.asarray(order, dtype=np.int64), self.workers) if len(p)]
        refs = [a.embed.remote([texts[i] for i in p]) for a, p in zip(self._actors, parts, strict=False)]
        try:
            results = self._ray.get(refs)
        except self._ray.exceptions.RayError as exc:  # a worker lost (OOM kill, node down)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise RunError(
                f"The Ray embedding workers failed ({type(exc).__name__}: {first}). What was "
                "embedded before is in the run's embedding cache: run the same command again, "
                "with fewer workers per node if they ran out of memory, or without --ray."
            ) from None
        out = np.zeros((len(texts), results[0].shape[1]), dtype=np.float32)
        for part, vectors in zip(parts, results, strict=True):
            out[part] = vectors
        return out
