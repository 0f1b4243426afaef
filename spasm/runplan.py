"""The plan of a run: every dialogue it holds, in a stable order, and the backends it uses.

Kept apart from the engine so that the dry run, shards and merge reason about the same plan.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from spasm.agents import derive_seed
from spasm.backends import Backend, make_backend
from spasm.config import RunConfig
from spasm.simulation import DialogueSpec

if TYPE_CHECKING:
    from spasm.executors.shards import Shard

__all__ = ["config_differences", "make_backends", "plan"]


def config_differences(old: Any, new: Any, prefix: str = "", limit: int = 6) -> str:
    """The dotted config fields that differ between two resolved configs, for messages."""
    out: list[str] = []

    def walk(a: Any, b: Any, path: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b)):
                walk(a.get(k), b.get(k), f"{path}.{k}" if path else str(k))
        elif a != b:
            out.append(f"{path or 'config'}: {json.dumps(a, default=str)[:40]} → "
                       f"{json.dumps(b, default=str)[:40]}")

    walk(old, new, prefix)
    if not out:
        return "the config format changed"
    more = f" and {len(out) - limit} more" if len(out) > limit else ""
    return "; ".join(out[:limit]) + more


def plan(
    config: RunConfig, personas: list[dict[str, Any]], shard: Shard | None = None
) -> Iterator[DialogueSpec]:
    """Every dialogue of the run, in a stable order. The seed depends on the persona and the
    conversation index only, so every pairing, condition and harness level of a conversation
    shares it. A harness sweep (``harness.levels``) adds one dialogue per level, with the level
    at the end of its id; without a sweep ids are unchanged and both agents take their
    configured level."""
    h = config.harness
    sweep: list[tuple[str, tuple[str, str]]] = (
        [(f"-{level}", (level, level)) for level in h.levels] if h.levels else
        [("", (h.client, h.responder))]
    )
    for persona in shard.select(personas) if shard is not None else personas:  # --shard I/N
        for k in range(config.conversations_per_persona):
            seed = derive_seed(config.seed, persona["persona_id"], k)
            for pairing in config.pairing_list:
                for condition in config.conditions:
                    did = f"{persona['persona_id']}-k{k}-{pairing.client}-{pairing.responder}-{condition}"
                    for suffix, levels in sweep:
                        yield DialogueSpec(did + suffix, persona, k, condition, pairing, seed, levels)


def make_backends(config: RunConfig) -> dict[str, Backend]:
    """Build every backend the config uses (a missing key env var fails here, before any I/O)."""
    used = {p.client for p in config.pairing_list} | {p.responder for p in config.pairing_list}
    if config.personas.backend:
        used.add(config.personas.backend)
    if config.termination.judge_backend:
        used.add(config.termination.judge_backend)
    if config.harness.backend:
        used.add(config.harness.backend)
    return {name: make_backend(name, config.backends[name]) for name in sorted(used)}
