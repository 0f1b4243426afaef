"""The one place that chooses each agent of a dialogue: plain or harnessed by its level,
audited or not, and the hooks that measure the agents after the dialogue (docs/harness.md).

The dialogue (:func:`spasm.simulation.simulate_dialogue`) is handed what this returns and knows
nothing of levels, audits or probes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from spasm.agents import PlainAgent, TurnAgent
from spasm.harness.levels import layers
from spasm.harness.measure import AuditedAgent, PersonaProbes, RecallProbes
from spasm.harness.profile import Presence
from spasm.harness.runtime import HarnessedAgent
from spasm.history import Speaker

if TYPE_CHECKING:
    from spasm.config import RunConfig
    from spasm.personas.persona import Persona
    from spasm.simulation import DialogueHook

__all__ = ["harness_agents", "harness_hooks"]


def harness_agents(
    plain: Sequence[PlainAgent], levels: Sequence[str], config: RunConfig,
    personas: Sequence[Persona | None], presences: Sequence[Presence | None] | None = None,
) -> list[TurnAgent]:
    """Each plain agent inside the layers of its level (level A stays plain), audited when
    ``harness.audit`` is on and its level has no verify layer of its own.

    ``personas``: each agent's (a client's own; ``None`` for a responder, which is never
    handed a persona); ``presences``: in a group dialogue, each seat's view of the group."""
    out: list[TurnAgent] = []
    seats = presences if presences is not None else [None] * len(plain)
    for agent, level, persona, presence in zip(plain, levels, personas, seats, strict=True):
        lv = layers(level)
        chosen: TurnAgent = (
            HarnessedAgent(agent, level, config, persona, presence) if lv.any else agent
        )
        if config.harness.audit and not lv.verify:
            chosen = AuditedAgent(chosen, config, persona, presence)
        out.append(chosen)
    return out


def harness_hooks(
    config: RunConfig, personas: Mapping[Speaker, Persona] | None = None
) -> list[DialogueHook]:
    """What measures the agents after the dialogue: the recall probes, then each client's
    persona probes (``personas``: the persona of each client speaker), each when asked for."""
    hooks: list[DialogueHook] = [RecallProbes(config)] if config.harness.recall_probe else []
    if config.harness.persona_probes and personas:
        hooks.append(PersonaProbes(config, personas))
    return hooks
