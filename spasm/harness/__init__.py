"""The Persona Harness around each agent (SPEC §4), one module per layer.

==============  =====================================================================
Module          Layer
==============  =====================================================================
``policy``      identity as policy: the card compiled into a :class:`CharacterPolicy`
``state``       state as data: :class:`AgentState` and the constrained reducer
``context``     structured context of older turns, intent and dialogue acts
``retrieval``   in-character example retrieval (lexical pre-filter, weighted re-rank)
``prompt``      the orchestrated prompt, stable parts first
``checker``     verify and rewrite
``levels``      the A–E ablation
``runtime``     one wrapped agent in one dialogue, turn by turn
``probe``       the long-range fact-recall probe
``report``      the per-level report (:func:`spasm.harness.report.level_report`)
==============  =====================================================================
"""

from __future__ import annotations

from spasm.harness.checker import Verdict
from spasm.harness.context import StructuredContext
from spasm.harness.levels import LEVELS, level_label
from spasm.harness.policy import POLICY_VERSION, CharacterPolicy
from spasm.harness.runtime import AgentHarness
from spasm.harness.state import AgentState, StateUpdate, apply_update

__all__ = [
    "LEVELS",
    "POLICY_VERSION",
    "AgentHarness",
    "AgentState",
    "CharacterPolicy",
    "StateUpdate",
    "StructuredContext",
    "Verdict",
    "apply_update",
    "level_label",
]
