"""The A–E ablation: which harness layers each level switches on (docs/harness.md, "Levels").

=====  ===========================================================================
Level  What the agent gets
=====  ===========================================================================
A      persona prompt only: its frame and the projection (ECP/CONCAT) of the whole history
B      A + rolling window: the last ``window`` utterances verbatim, older ones as a
       structured record; intent and unresolved questions in the scene
C      B + external state: the persona compiled into a policy (the orchestrated prompt) and
       a state evolved by the reducer under hard constraints
D      C + retrieval of 4–5 in-character examples
E      D + verify and rewrite: a checker scores each candidate; one rewrite on failure
=====  ===========================================================================

A level is a list of layers (:data:`LEVELS`, data, not ``if level >= "C"`` in the code); each
level lists the one before it plus what it adds. A level without layers is the plain agent.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal

__all__ = ["LEVELS", "Layer", "Layers", "layers", "level_label"]

#: The layers, in the order a turn runs them.
Layer = Literal["window", "policy", "state", "retrieval", "verify"]

LEVELS: dict[str, tuple[Layer, ...]] = {
    "A": (),
    "B": ("window",),
    "C": ("window", "policy", "state"),
    "D": ("window", "policy", "state", "retrieval"),
    "E": ("window", "policy", "state", "retrieval", "verify"),
}


@dataclass(frozen=True)
class Layers:
    """The layers switched on at one level, as flags the runtime reads."""

    window: bool = False
    policy: bool = False
    state: bool = False
    retrieval: bool = False
    verify: bool = False

    @classmethod
    def of(cls, names: tuple[Layer, ...]) -> Layers:
        """The flags of a list of layers."""
        return cls(**{f.name: f.name in names for f in fields(cls)})

    @property
    def any(self) -> bool:
        """Whether any layer is on (else the agent is the plain agent)."""
        return any(getattr(self, f.name) for f in fields(self))


def layers(level: str) -> Layers:
    """The layers of ``level`` (A–E)."""
    return Layers.of(LEVELS[level])


def level_label(*levels: str) -> str:
    """The ``dialogues.harness_level`` value: one letter when every agent has the same level,
    else the levels joined by ``/`` in order (``client/responder`` like the pairing label; a
    group dialogue's seats in turn order)."""
    return levels[0] if len(set(levels)) == 1 else "/".join(levels)
