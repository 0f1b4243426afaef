"""The plan of a run: every dialogue it holds, in a stable order, and the backends it uses.

Kept apart from the engine so that the dry run, shards and merge reason about the same plan.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from spasm.backends import Backend, make_backend
from spasm.config import RunConfig
from spasm.errors import RunError
from spasm.runner import DialogueSpec
from spasm.seeds import derive_seed

if TYPE_CHECKING:
    from spasm.executors.shards import Shard

__all__ = ["config_differences", "dialogue_id", "id_part", "legacy_dialogue_id", "make_backends", "plan"]


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


def id_part(name: str) -> str:
    """A backend or condition name as it stands in a dialogue id: ``-`` (the separator) and
    ``%`` (the escape) percent-encoded, so ids are unique by construction
    (``gpt``/``4o-mini`` and ``gpt-4o``/``mini`` no longer give one id). A name without either
    character is unchanged, so those ids are byte-identical to earlier versions."""
    return name.replace("%", "%25").replace("-", "%2D")


def dialogue_id(persona_id: str, k: int, client: str, responder: str, condition: str,
                level: str | None = None) -> str:
    """The id of one planned dialogue: ``<persona>-k<k>-<client>-<responder>-<condition>``,
    then ``-<level>`` in a harness sweep. Every part after the persona id is free of ``-``
    (:func:`id_part`; a level is one letter), so reading from the right recovers each part:
    different dialogues of a run never share an id, whatever their names."""
    did = f"{persona_id}-k{k}-{id_part(client)}-{id_part(responder)}-{id_part(condition)}"
    return did if level is None else f"{did}-{level}"


def legacy_dialogue_id(persona_id: str, k: int, client: str, responder: str, condition: str,
                       level: str | None = None) -> str:
    """The id an older spasm gave the same dialogue (names joined unescaped), to recognise a
    run written before :func:`id_part`."""
    did = f"{persona_id}-k{k}-{client}-{responder}-{condition}"
    return did if level is None else f"{did}-{level}"


def plan(
    config: RunConfig, personas: list[dict[str, Any]], shard: Shard | None = None,
    *, ids: Callable[..., str] = dialogue_id,
) -> Iterator[DialogueSpec]:
    """Every dialogue of the run, in a stable order. The seed depends on the persona and the
    conversation index only, so every pairing, condition and harness level of a conversation
    shares it. A harness sweep (``harness.levels``) adds one dialogue per level, with the level
    at the end of its id; without a sweep ids are unchanged and both agents take their
    configured level.

    Two planned dialogues with one id would store one and lose the other: that is a bug (or a
    personas table with a repeated persona id), and a :class:`~spasm.errors.RunError` stops the
    plan before any dialogue is run. ``ids`` builds the ids (:func:`legacy_dialogue_id` to list
    an older version's; no check then)."""
    h = config.harness
    sweep: list[tuple[str | None, tuple[str, str]]] = (
        [(level, (level, level)) for level in h.levels] if h.levels else
        [(None, (h.client, h.responder))]
    )
    seen: set[str] | None = set() if ids is dialogue_id else None
    for persona in shard.select(personas) if shard is not None else personas:  # --shard I/N
        for k in range(config.conversations_per_persona):
            seed = derive_seed(config.seed, persona["persona_id"], k)
            for pairing in config.pairing_list:
                for condition in config.conditions:
                    for level, levels in sweep:
                        did = ids(str(persona["persona_id"]), k, pairing.client,
                                  pairing.responder, condition, level)
                        if seen is not None:
                            if did in seen:
                                raise RunError(
                                    f"two planned dialogues share the id {did!r} (persona "
                                    f"{persona['persona_id']!r}, conversation {k}, pairing "
                                    f"{pairing.label}, condition {condition}): one would be lost. "
                                    "Nothing was run. This is a bug in spasm, or the run's "
                                    "personas table repeats a persona id; please report it."
                                )
                            seen.add(did)
                        yield DialogueSpec(did, persona, k, condition, pairing, seed, levels)


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
