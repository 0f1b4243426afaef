"""The Persona Harness around each agent (docs/harness.md), one module per layer.

==================  =====================================================================
Module              Layer
==================  =====================================================================
``policy``          identity as policy: the card compiled into a :class:`CharacterPolicy`
``state``           state as data: :class:`AgentState` and the constrained reducer
``context``         structured context of older turns, intent and dialogue acts
``retrieval``       in-character example retrieval (lexical pre-filter, weighted re-rank)
``prompt``          the orchestrated prompt, stable parts first
``checker``         verify and rewrite
``levels``          the A–E ablation: each level a list of layers
``profile``         who an agent is to its harness; its resolved policy
``verify``          the check-and-rewrite loop at run time
``runtime``         :class:`HarnessedAgent`: a plain agent in the layers of its level
``measure``         measurements outside the agent: the audit and the recall probe
``probe``           the long-range fact-recall probe's question and score
``notes``           what the harness adds to a turn (:class:`~spasm.harness.notes.HarnessNotes`)
``factory``         the one place that chooses plain, harnessed or audited agents
``level_metrics``   the per-level metrics the report computes
``level_report``    the per-level report (:func:`spasm.harness.level_report.level_report`)
==================  =====================================================================
"""

from __future__ import annotations

from spasm.harness.checker import Verdict
from spasm.harness.context import StructuredContext
from spasm.harness.levels import LEVELS, level_label
from spasm.harness.policy import POLICY_VERSION, CharacterPolicy
from spasm.harness.runtime import HarnessedAgent
from spasm.harness.state import AgentState, StateUpdate, apply_update

__all__ = [
    "LEVELS",
    "POLICY_VERSION",
    "AgentState",
    "CharacterPolicy",
    "HarnessedAgent",
    "StateUpdate",
    "StructuredContext",
    "Verdict",
    "apply_update",
    "level_label",
]
