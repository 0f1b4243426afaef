"""What the harness adds to a turn: its own typed record, carried by
:attr:`spasm.agents.Turn.notes` and stored through :class:`~spasm.agents.NoteColumns`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spasm.agents import NoteColumns
from spasm.dataset.columns import dump_verdict

if TYPE_CHECKING:
    from spasm.harness.state import AgentState, Reduction

__all__ = ["HarnessNotes"]


@dataclass(frozen=True)
class HarnessNotes:
    """A harnessed (or audited) turn's verdict, state, reducer step, intent and fallbacks."""

    verdict: dict[str, Any] | None = None
    #: The speaker's state after its turn (levels with the state layer).
    state: AgentState | None = None
    reduction: Reduction | None = None
    intent: str | None = None
    #: Harness calls of this turn that fell back (see :mod:`spasm.harness.runtime`).
    fallbacks: int = 0

    def columns(self) -> NoteColumns:
        """``turns.checker_verdict``, ``state``, ``state_clips``, ``state_log``, ``intent``
        and ``harness_fallbacks``."""
        return NoteColumns(
            checker_verdict=dump_verdict(self.verdict) if self.verdict else None,
            state=self.state.to_json() if self.state is not None else None,
            state_clips=len(self.reduction.clips) if self.reduction else 0,
            state_log=self.reduction.log() if self.reduction else None,
            intent=self.intent,
            harness_fallbacks=self.fallbacks,
        )
