"""Sizing a sharded run for an executor: how many shards run at once on a machine's backends,
and each shard's share of the backends' limits.

What a shard is (``spasm generate --shard I/N``: shard I runs every dialogue of the personas
whose ``persona_index % N == I``, with the unsharded run's seeds and ids) is the plan's:
:class:`spasm.runplan.Shard`, re-exported here for the executors. Every shard draws the whole
persona set with the run's seed and keeps its own personas; its manifest records the shard and
a digest of the whole persona set, so a merge can tell shards of one run apart from shards that
drew different personas.
"""

from __future__ import annotations

from typing import Any

from spasm.config import parallel_ways
from spasm.runplan import Shard

__all__ = ["Shard", "parallel_shards", "share_limits"]


def parallel_shards(config: Any, shards: int, slots: int) -> int:
    """How many shards may run at once so each gets a whole share of every limit: at most
    ``shards`` and ``slots``, and no more than the ``max_concurrency`` or ``rpm`` of a backend
    the run uses (``RunConfig.used_backends``)."""
    return parallel_ways((config.backends[name] for name in config.used_backends), min(shards, slots))


def share_limits(config: Any, ways: int, shards: int) -> Any:
    """The config one of ``ways`` shards running at once uses: each backend's
    ``max_concurrency``, ``rpm`` and ``tpm`` divided by ``ways`` (rounded down, so the shares
    add up to at most the limit), and the budget caps (``engine.max_cost``/``max_tokens``,
    which count a whole run) divided by ``shards``. None of these is part of the config
    fingerprint, so the shards still merge and resume as one run."""
    if ways <= 1 and shards <= 1:
        return config
    backends = {name: b.shared(ways) for name, b in config.backends.items()}
    ec = config.engine
    engine = ec.model_copy(update={
        "max_cost": ec.max_cost / shards if ec.max_cost is not None else None,
        "max_tokens": max(1, ec.max_tokens // shards) if ec.max_tokens is not None else None,
    })
    return config.model_copy(update={"backends": backends, "engine": engine})
