"""Running one plan beyond one process (docs/cluster.md): deterministic shards, and executors on an
existing engine (Ray) that run the shards and merge them.

==================  ===================================================================
Module              What it owns
==================  ===================================================================
``shards``          :class:`Shard` (``--shard I/N``): which personas a shard runs, its
                    record in the manifest, the resume check, the share of the limits
``ray_executor``    ``spasm generate --executor ray``: the shards as Ray tasks, retried,
                    resumed, one progress bar, merged at the end (needs the ``ray`` extra)
==================  ===================================================================

docs/cluster.md describes running on a cluster.
"""

from __future__ import annotations

from spasm.runplan import Shard

__all__ = ["Shard"]
