"""A person in a seat: ``kind: human`` answers each request by asking a person.

::

    backends:
      person: {kind: human, operator: op-3f2a, interface: terminal}

The seat's agent is the plain one (level A): its frame and the projection of the history are
built as for a model, and this backend hands that request to a :class:`Person` (the terminal
of ``spasm play``, the viewer's play page) instead of a model. The person's line comes back as
the completion, with what the interface could measure of the typing (:class:`PersonReply`:
``typing_ms``, ``edits``, ``pasted_chars``; ``None`` where it measured nothing), which the run
layer stores with the turn (:mod:`spasm.people`).

It goes through :class:`~spasm.calls.Caller` like any backend (logged in the calls table), but
is never cached or replayed (``cacheable = False``), never retried by timeout (a person takes the
time they take: ``timeout_s`` is not applied) and takes one request at a time. What a person
types is not a model's output (``typed_by_person``): its call rows carry no tokens, and the run
counts the person's turns and the tokens of their text apart (``typed_turns``, ``typed_tokens``
in the summary line and the manifest's ``usage``), never in the model token totals, the cost
or the token cap; the turn itself keeps its text's length (``turns.n_tokens``). A person who
ends the dialogue (``/end``, Ctrl-D, Ctrl-C) raises :class:`~spasm.errors.ParticipantLeft`
from the person: the dialogue stops there and is saved.

A backend built from a config alone has no person to ask: ``spasm generate`` on a config with
a human seat stops at start-up (exit 2) and says to take the seat with ``spasm play``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from spasm.backends.base import Backend, ChatRequest, Completion
from spasm.backends.registry import register_backend
from spasm.config import BackendConfig
from spasm.errors import FatalBackendError, UserError
from spasm.tokens import count_messages, count_tokens

__all__ = ["HumanBackend", "Person", "PersonReply"]


@dataclass(frozen=True)
class PersonReply:
    """One line a person typed, and what the interface measured while they typed it."""

    text: str
    #: From the moment the prompt was shown to the line's submission (milliseconds).
    typing_ms: int | None = None
    #: Deletions and corrections while typing (the web page counts them; a terminal cannot).
    edits: int | None = None
    #: Characters that arrived by pasting (the web page counts them; a terminal cannot).
    pasted_chars: int | None = None


class Person(Protocol):
    """Who answers for a human seat: shown the seat's request, returns one line."""

    async def reply(self, request: ChatRequest, backend: str) -> PersonReply:
        """The person's next line for this request (raise ParticipantLeft to end)."""
        ...

    async def debrief(self, dialogue_id: str, goal: str | None,
                      transcript: Sequence[tuple[str, str]], reason: str) -> dict[str, Any]:
        """After the dialogue (``transcript``: its utterances as (speaker, text); ``reason``:
        why it ended): the person's own verdict, as ``person_goal_met`` (bool) and
        ``person_rating`` (1-5); an empty mapping when they gave none."""
        ...


@register_backend("human")
class HumanBackend(Backend):
    """A seat a person takes: each request is answered by :attr:`person`."""

    cacheable = False
    max_concurrency = 1
    typed_by_person = True

    def __init__(self, name: str, cfg: BackendConfig, person: Person | None = None) -> None:
        self.name = name
        self.model = cfg.model
        #: The person's pseudonym (never a real name by default) and how they take part.
        self.operator = cfg.operator or "anonymous"
        self.interface = cfg.interface or "terminal"
        self.person = person
        #: What each answered turn measured, by (dialogue id, turn index), until the run layer
        #: takes it into the turns table (:meth:`take`).
        self._replies: dict[tuple[str | None, int | None], PersonReply] = {}

    @property
    def identity(self) -> str:
        return f"HumanBackend:{self.operator}"

    async def preflight(self) -> None:
        if self.person is None:
            raise UserError(
                f"backend {self.name!r} is a seat for a person (kind: human); a run cannot ask "
                "anyone from here. Take the seat with `spasm play --config FILE --seat ...`, or "
                "give the seat a model backend.")

    async def complete(self, request: ChatRequest) -> Completion:
        if self.person is None:
            raise FatalBackendError(f"backend {self.name!r} (kind: human) has no person attached")
        if request.json_schema is not None:
            raise FatalBackendError(
                f"backend {self.name!r} is a person's seat and was sent a structured request "
                "(a judge or harness call); give that role a model backend")
        t0 = time.perf_counter()
        reply = await self.person.reply(request, self.name)
        ctx = request.context
        self._replies[(ctx.dialogue_id if ctx else None, ctx.turn_index if ctx else None)] = reply
        return Completion(
            text=reply.text, prompt_tokens=count_messages(request.messages),
            completion_tokens=count_tokens(reply.text), resolved_model=self.model,
            latency_s=time.perf_counter() - t0,
        )

    def take(self, dialogue_id: str) -> dict[int, PersonReply]:
        """The replies of one dialogue by turn index, forgotten here once taken."""
        mine = {k: v for k, v in self._replies.items() if k[0] == dialogue_id and k[1] is not None}
        for k in mine:
            del self._replies[k]
        return {k[1]: v for k, v in mine.items() if k[1] is not None}
