"""The one place that chooses each agent of a dialogue: plain or harnessed by its level,
audited or not, and the hooks that measure the agents after the dialogue (SPEC §4).

The dialogue (:func:`spasm.simulation.simulate_dialogue`) is handed what this returns and knows
nothing of levels, audits or probes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from spasm.agents import PlainAgent, TurnAgent
from spasm.harness.levels import layers
from spasm.harness.measure import AuditedAgent, PersonaProbes, RecallProbes
from spasm.harness.runtime import HarnessedAgent

if TYPE_CHECKING:
    from spasm.config import RunConfig
    from spasm.simulation import DialogueHook

__all__ = ["harness_agents", "harness_hooks"]


def harness_agents(
    plain: Sequence[PlainAgent], levels: Sequence[str], config: RunConfig, persona: dict[str, Any]
) -> list[TurnAgent]:
    """Each plain agent inside the layers of its level (level A stays plain), audited when
    ``harness.audit`` is on and its level has no verify layer of its own."""
    out: list[TurnAgent] = []
    for agent, level in zip(plain, levels, strict=True):
        lv = layers(level)
        chosen: TurnAgent = HarnessedAgent(agent, level, config, persona) if lv.any else agent
        if config.harness.audit and not lv.verify:
            chosen = AuditedAgent(chosen, config, persona)
        out.append(chosen)
    return out


def harness_hooks(config: RunConfig, persona: Mapping[str, Any] | None = None) -> list[DialogueHook]:
    """What measures the agents after the dialogue: the recall probes, then the Client's
    persona probes (about ``persona``), each when asked for."""
    hooks: list[DialogueHook] = [RecallProbes(config)] if config.harness.recall_probe else []
    if config.harness.persona_probes and persona is not None:
        hooks.append(PersonaProbes(config, persona))
    return hooks
