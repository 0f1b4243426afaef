"""The perspective-agnostic dialogue history (docs/architecture.md).

The history is stored once, with absolute speakers. It is immutable: appending returns a new
history, so a projection computed from it can never change under an agent's feet.

Besides utterances it holds **events**: what agents *did* within their turns —
``tool_call``, ``tool_result`` and ``notice`` — each with its ``actor`` and who may see it
(``visible_to``: participant ids). Visibility is data: a projection decides from it what each
viewer's frame shows (:mod:`spasm.projection`). Events are kept apart from the utterances (``len``,
iteration and indexing count utterances only), so everything that reads words sees words only;
an event records the index of the utterance whose turn it belongs to (``turn_index``: it
happened after ``turn_index`` utterances, before that turn's utterance).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

#: Who spoke: a participant's id. In a two-party dialogue the ids are the roles themselves,
#: ``client`` and ``responder``; in a group dialogue they are the participants' short names.
Speaker = str
#: The two sides a participant can take.
Role = Literal["client", "responder"]
#: What an event records: a call of a tool, its result, or a line others are shown instead.
EventKind = Literal["tool_call", "tool_result", "notice"]
#: The event kinds, in the order the events table documents them.
EVENT_KINDS: tuple[EventKind, ...] = ("tool_call", "tool_result", "notice")


@dataclass(frozen=True, slots=True)
class Utterance:
    """One utterance ``u_k = (s_k, c_k)``: an absolute speaker and its content."""

    speaker: Speaker
    content: str


@dataclass(frozen=True, slots=True)
class Event:
    """One action in the history (a row of the ``events`` table, less its dialogue and seq).

    ``arguments`` and ``result`` are canonical JSON text (what the tool was called with and
    what it returned); ``error`` says why a call failed (its arguments did not follow the
    schema, it raised, it ran past its timeout): the agent sees it and goes on. ``notice`` is
    the line a participant other than the actor is shown for this event (``None``: others who
    may see it are shown its payload rendered as a line). ``world_sha256`` is the world's hash
    after the event."""

    kind: EventKind
    actor: Speaker
    #: The index of the utterance whose turn this event belongs to.
    turn_index: int
    #: Who may see the event (participant ids); the actor always does.
    visible_to: tuple[Speaker, ...]
    #: Pairs a call with its result (the OpenAI ``tool_call_id``).
    call_id: str | None = None
    tool: str | None = None
    arguments: str | None = None
    result: str | None = None
    error: str | None = None
    notice: str | None = None
    world_sha256: str | None = None

    def visible(self, viewer: Speaker) -> bool:
        """Whether ``viewer`` may see this event."""
        return viewer == self.actor or viewer in self.visible_to

    @property
    def payload(self) -> tuple[str, ...]:
        """What the event carries besides its notice: its arguments, result and error."""
        return tuple(p for p in (self.arguments, self.result, self.error) if p)


@dataclass(frozen=True, slots=True)
class History:
    """``H_t = (u_1 … u_t)`` and the events between them; immutable, appended to and never
    rewritten."""

    utterances: tuple[Utterance, ...] = ()
    #: Every event so far, in the order it happened (its position is the events table's seq).
    events: tuple[Event, ...] = ()

    def append(self, speaker: Speaker, content: str) -> History:
        """Return a new history with one more utterance."""
        return History((*self.utterances, Utterance(speaker, content)), self.events)

    def with_events(self, events: Sequence[Event]) -> History:
        """Return a new history with ``events`` after the ones it has."""
        if not events:
            return self
        return History(self.utterances, (*self.events, *events))

    def events_of(self, turn_index: int) -> tuple[Event, ...]:
        """The events of the turn that wrote (or writes) utterance ``turn_index``."""
        return tuple(e for e in self.events if e.turn_index == turn_index)

    def __len__(self) -> int:
        return len(self.utterances)

    def __iter__(self) -> Iterator[Utterance]:
        return iter(self.utterances)

    def __getitem__(self, index: int) -> Utterance:
        return self.utterances[index]

    def last(self, m: int) -> tuple[Utterance, ...]:
        """The last ``m`` utterances (fewer if the history is shorter)."""
        return self.utterances[-m:] if m > 0 else ()
