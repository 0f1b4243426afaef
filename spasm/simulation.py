"""One dialogue: the Client opens, the agents alternate, the detector chain decides
(docs/architecture.md).

The dialogue knows only its seam: the :class:`~spasm.agents.TurnAgent`\\ s it is handed (plain,
harnessed, audited or scripted: it cannot tell), the termination chain, the session and the
hooks to run after the last turn. Choosing the agents, building the chain and turning the
outcome into a run's rows is the run layer's job (:mod:`spasm.runner`).

A failure never escapes (except a budget stop, which ends the whole run): it is returned with
the dialogue so far, to be quarantined. A failure that is not a :class:`~spasm.errors.RunError`
is a bug in spasm or in a plugged-in agent, and keeps its full traceback.
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from spasm.agents import Turn, TurnAgent
from spasm.dataset.rows import EventRow, GroupTurnRow, TurnRow
from spasm.errors import BudgetExceededError, ParticipantLeft, RunError, disk_full
from spasm.history import Event, History
from spasm.projection import messages_digest
from spasm.session import DialogueSession
from spasm.termination import TerminationChain
from spasm.turn_order import NextSpeaker, Seat

__all__ = ["Conversation", "DialogueHook", "event_row", "simulate_dialogue", "simulate_group",
           "turn_row"]


class DialogueHook(Protocol):
    """Runs after the last turn (the harness's recall probes); may annotate the turns."""

    async def after(
        self, agents: Sequence[TurnAgent], history: History, turns: list[TurnRow],
        session: DialogueSession,
    ) -> None:
        """Measure the agents after ``history``; may set fields of ``turns``."""
        ...


@dataclass
class Conversation:
    """How one dialogue went: its turns, and why it ended or what stopped it."""

    history: History = field(default_factory=History)
    turns: list[TurnRow] = field(default_factory=list)
    reason: str = ""
    detail: str = ""
    #: The failure that ended the dialogue early (quarantined), or ``None``.
    error: BaseException | None = None
    #: The full traceback of a failure that is not a :class:`~spasm.errors.RunError` (a bug).
    traceback: str | None = None


def turn_row(dialogue_id: str, index: int, t: Turn) -> TurnRow:
    """The turns-table row of utterance ``index``."""
    notes = t.notes.columns() if t.notes is not None else None
    return TurnRow(
        dialogue_id=dialogue_id,
        turn_index=index,
        speaker=t.speaker,
        text=t.text,
        n_tokens=t.completion.completion_tokens,
        prompt_tokens=t.completion.prompt_tokens,
        latency_s=t.completion.latency_s,
        attempts=t.attempts,
        checker_verdict=notes.checker_verdict if notes else None,
        flagged=t.flagged,
        messages_sha256=messages_digest(t.messages),
        flag_reason=t.flag_reason,
        intent=notes.intent if notes else None,
        state=notes.state if notes else None,
        state_clips=notes.state_clips if notes else 0,
        state_log=notes.state_log if notes else None,
        harness_fallbacks=notes.harness_fallbacks if notes else 0,
        cached_prompt_tokens=t.cached_prompt_tokens,
        messages=t.stored_messages(),
        probe=None,
    )


def event_row(dialogue_id: str, seq: int, event: Event) -> EventRow:
    """The events-table row of ``event``, the ``seq``-th of its dialogue."""
    return EventRow(dialogue_id=dialogue_id, seq=seq, turn_index=event.turn_index,
                    kind=event.kind, actor=event.actor, call_id=event.call_id, tool=event.tool,
                    arguments=event.arguments, result=event.result, error=event.error,
                    visible_to=json.dumps(list(event.visible_to), ensure_ascii=False),
                    notice=event.notice, world_sha256=event.world_sha256)


async def _converse(
    dialogue_id: str, agents: Sequence[TurnAgent], chain: TerminationChain,
    session: DialogueSession, max_turns_per_agent: int, out: Conversation,
) -> None:
    for agent in agents:
        await agent.setup(session)
    for _ in range(max_turns_per_agent):
        for agent in agents:
            before = out.history
            t = await agent.turn(before, session)
            out.history = before.with_events(t.events).append(agent.speaker, t.text)
            out.turns.append(turn_row(dialogue_id, len(before), t))
        stop = await chain.check(out.history, session.scope)
        if stop is not None:
            out.reason, out.detail = stop.reason, stop.detail
            return
    out.reason, out.detail = "max_turns", f"cap of {max_turns_per_agent} turns per agent"


async def simulate_dialogue(
    dialogue_id: str,
    agents: Sequence[TurnAgent],
    chain: TerminationChain,
    session: DialogueSession,
    *,
    max_turns_per_agent: int,
    hooks: Sequence[DialogueHook] = (),
) -> Conversation:
    """Run one dialogue to its end: every agent is set up, then they speak in order, turn after
    turn, until the chain stops them or each has spoken ``max_turns_per_agent`` times; then
    the hooks run. Failures are returned in the :class:`Conversation`, never raised (except
    a budget stop, which ends the whole run)."""
    out = Conversation()
    return await _guarded(
        out, _converse(dialogue_id, agents, chain, session, max_turns_per_agent, out),
        agents, session, hooks,
    )


async def _guarded(
    out: Conversation, conversation: Awaitable[None], agents: Sequence[TurnAgent],
    session: DialogueSession, hooks: Sequence[DialogueHook],
) -> Conversation:
    """Run a dialogue's turns, then its hooks; a failure is kept in ``out`` with the dialogue
    so far (a bug with its traceback), never raised — except a budget stop. A person who
    leaves (:class:`~spasm.errors.ParticipantLeft`) ends it with what was said, hooks not run."""
    try:
        try:
            await conversation
        except ParticipantLeft as left:  # a person ended it: saved as it stands, not a failure
            out.reason, out.detail = left.reason, left.detail
            return out
        for hook in hooks:
            await hook.after(agents, out.history, out.turns, session)
    except BudgetExceededError:
        raise
    except Exception as exc:
        if disk_full(exc):
            raise  # the environment, not the dialogue's fault: the run stops, nothing quarantined
        out.error = exc
        if not isinstance(exc, RunError):
            out.traceback = "".join(traceback.format_exception(exc))
    except SystemExit as exc:  # sys.exit() in code the dialogue ran (a plugin's): a bug, not an exit
        out.error = RuntimeError(f"sys.exit({exc.code!r}) was called during the dialogue; code "
                                 "spasm runs (a plugin's backend, detector, projection) must raise, "
                                 "not exit")
        out.traceback = "".join(traceback.format_exception(exc))
    return out


async def _converse_group(
    dialogue_id: str, agents: Sequence[TurnAgent], seats: Sequence[Seat], order: NextSpeaker,
    chain: TerminationChain, session: DialogueSession, opener: str, max_utterances: int,
    out: Conversation,
) -> None:
    by_id = {a.speaker: a for a in agents}
    roles = {s.id: s.role for s in seats}
    for agent in agents:
        await agent.setup(session)
    speaker, reason = opener, "opener"
    while len(out.history) < max_utterances:
        before = out.history
        t = await by_id[speaker].turn(before, session)
        out.history = before.with_events(t.events).append(speaker, t.text)
        row = turn_row(dialogue_id, len(before), t)
        out.turns.append(GroupTurnRow(**row.as_record(), role=roles[speaker],
                                      next_speaker_reason=reason))
        stop = await chain.check(out.history, session.scope)
        if stop is not None:
            out.reason, out.detail = stop.reason, stop.detail
            return
        choice = await order.choose(out.history, session)
        speaker, reason = choice.speaker, choice.reason
    out.reason, out.detail = "max_utterances", f"cap of {max_utterances} utterances"


async def simulate_group(
    dialogue_id: str,
    agents: Sequence[TurnAgent],
    seats: Sequence[Seat],
    order: NextSpeaker,
    chain: TerminationChain,
    session: DialogueSession,
    *,
    opener: str,
    max_utterances: int,
    hooks: Sequence[DialogueHook] = (),
) -> Conversation:
    """Run one group dialogue: every participant is set up, ``opener`` speaks first, then
    ``order`` picks each next speaker, until the chain stops them or ``max_utterances`` is
    reached; then the hooks run. Each turn row records the speaker's role and why it was
    chosen. Failures are returned as in :func:`simulate_dialogue`."""
    out = Conversation()
    return await _guarded(
        out, _converse_group(dialogue_id, agents, seats, order, chain, session, opener,
                             max_utterances, out),
        agents, session, hooks,
    )
