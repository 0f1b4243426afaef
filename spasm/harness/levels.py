"""The A–E ablation: which harness layers each level switches on (SPEC §4, seed experiment).

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
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LEVELS", "Layers", "layers", "level_label"]


@dataclass(frozen=True)
class Layers:
    """The layers switched on at one level."""

    window: bool = False
    policy: bool = False
    state: bool = False
    retrieval: bool = False
    verify: bool = False


LEVELS: dict[str, Layers] = {
    "A": Layers(),
    "B": Layers(window=True),
    "C": Layers(window=True, policy=True, state=True),
    "D": Layers(window=True, policy=True, state=True, retrieval=True),
    "E": Layers(window=True, policy=True, state=True, retrieval=True, verify=True),
}


def layers(level: str) -> Layers:
    """The layers of ``level`` (A–E)."""
    return LEVELS[level]


def level_label(client: str, responder: str) -> str:
    """The ``dialogues.harness_level`` value: one letter when both agents share the level,
    else ``client/responder`` (like the pairing label)."""
    return client if client == responder else f"{client}/{responder}"
