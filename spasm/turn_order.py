"""Who speaks next in a group dialogue (README, "Group dialogues").

A policy is handed the history and the seats (each participant's id and role, in order) and
returns a :class:`Choice`: the next speaker and why. The policies that ship with spasm are
registered by name in :data:`spasm.registry.NEXT_SPEAKERS` (``group.next_speaker`` in the
config picks one) and a plugin registers its own with :func:`register_next_speaker`:

* ``round_robin``: the seat after the last speaker, in order;
* ``addressed``: the participant the last utterance names (its id as a word, or ``@id``; the
  last one named when several are) — a question to someone is answered by them; nobody else
  named: round robin;
* ``random``: a seeded draw among the others;
* ``llm``: a moderator call (role ``moderator``) that picks among the ids, structured (the ids
  are the schema's only allowed values, so a reply naming anyone else is re-asked by the
  caller), with its reason; no usable answer: round robin, and the reason says so.

No participant speaks twice in a row unless ``allow_repeat``. This module is part of the
dialogue layer: it knows the history, the seats and the session, never the run config.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, cast

from pydantic import BaseModel, ConfigDict, Field, create_model

from spasm.backends.base import Message
from spasm.errors import BackendError, ConfigError
from spasm.history import History, Role, Speaker
from spasm.registry import NEXT_SPEAKERS
from spasm.seeds import derive_seed
from spasm.session import DialogueSession

__all__ = [
    "Choice", "NextSpeaker", "Seat", "TurnOrderSetup", "is_moderator_fallback", "make_next_speaker",
    "register_next_speaker",
]


@dataclass(frozen=True)
class Seat:
    """One participant as the turn order sees it."""

    id: Speaker
    role: Role


@dataclass(frozen=True)
class Choice:
    """The next speaker and why (stored as ``turns.next_speaker_reason``)."""

    speaker: Speaker
    reason: str


@dataclass(frozen=True)
class TurnOrderSetup:
    """What a policy factory is handed for one dialogue."""

    seats: tuple[Seat, ...]
    #: Whether a participant may speak twice in a row.
    allow_repeat: bool = False
    #: The backend the ``llm`` moderator asks, and its temperature.
    moderator_backend: str | None = None
    moderator_temperature: float = 0.0


class NextSpeaker(Protocol):
    """A turn-order policy for one dialogue."""

    async def choose(self, history: History, session: DialogueSession) -> Choice:
        """The participant who speaks after ``history`` (never empty: the opener spoke)."""
        ...


NextSpeakerFactory = Callable[[TurnOrderSetup], NextSpeaker]


def register_next_speaker(name: str, *, replace: bool = False
                          ) -> Callable[[NextSpeakerFactory], NextSpeakerFactory]:
    """Register a policy factory under ``name`` (decorator; ``group.next_speaker`` names it; a
    plugin replaces a built-in only with ``replace=True``)."""

    def decorator(factory: NextSpeakerFactory) -> NextSpeakerFactory:
        NEXT_SPEAKERS.register(name, replace=replace)(factory)
        return factory

    return decorator


def make_next_speaker(name: str, setup: TurnOrderSetup) -> NextSpeaker:
    """The policy registered under ``name`` for one dialogue (an unknown name is a
    :class:`ConfigError`)."""
    factory = cast("NextSpeakerFactory | None", NEXT_SPEAKERS.get(name))
    if factory is None:
        raise ConfigError(f"Unknown next-speaker policy {name!r}; known: "
                          f"{', '.join(NEXT_SPEAKERS.names())}")
    return factory(setup)


def _ids(setup: TurnOrderSetup) -> list[Speaker]:
    return [s.id for s in setup.seats]


def _round_robin(setup: TurnOrderSetup, history: History) -> Speaker:
    """The seat after the last speaker, in order."""
    ids = _ids(setup)
    last = history[len(history) - 1].speaker
    return ids[(ids.index(last) + 1) % len(ids)]


class RoundRobin:
    """Every participant in turn, in the order of the seats."""

    def __init__(self, setup: TurnOrderSetup) -> None:
        self.setup = setup

    async def choose(self, history: History, session: DialogueSession) -> Choice:
        return Choice(_round_robin(self.setup, history), "round robin")


def addressed_in(text: str, ids: Sequence[Speaker], speaker: Speaker) -> Speaker | None:
    """The participant ``text`` addresses: the last id (other than ``speaker``'s) it names as a
    word or as ``@id``, case-insensitively; ``None`` when it names nobody else."""
    best: tuple[int, Speaker] | None = None
    for pid in ids:
        if pid == speaker:
            continue
        for m in re.finditer(rf"(?<![\w@])@?{re.escape(pid)}(?!\w)", text, flags=re.IGNORECASE):
            if best is None or m.start() > best[0]:
                best = (m.start(), pid)
    return best[1] if best else None


class Addressed:
    """The participant named last in the last utterance answers; nobody named: round robin."""

    def __init__(self, setup: TurnOrderSetup) -> None:
        self.setup = setup

    async def choose(self, history: History, session: DialogueSession) -> Choice:
        last = history[len(history) - 1]
        named = addressed_in(last.content, _ids(self.setup), last.speaker)
        if named is not None:
            return Choice(named, f"addressed by {last.speaker}")
        return Choice(_round_robin(self.setup, history), "nobody addressed: round robin")


class RandomOrder:
    """A seeded draw among the participants (the last speaker too with ``allow_repeat``)."""

    def __init__(self, setup: TurnOrderSetup) -> None:
        self.setup = setup

    async def choose(self, history: History, session: DialogueSession) -> Choice:
        last = history[len(history) - 1].speaker
        pool = [p for p in _ids(self.setup) if self.setup.allow_repeat or p != last]
        rng = random.Random(derive_seed(session.seed, "next_speaker", len(history)))
        return Choice(rng.choice(pool), "random draw")


def _choice_schema(ids: Sequence[Speaker]) -> type[BaseModel]:
    """A moderator reply whose ``speaker`` can only be one of ``ids``."""
    allowed: Any = Literal[tuple(ids)]
    return create_model(
        "NextSpeakerChoice", __config__=ConfigDict(extra="ignore"),
        speaker=(allowed, Field(description="the id of the participant who speaks next")),
        reason=(str, Field(description="why, in one sentence")),
    )


def moderator_messages(history: History, seats: Sequence[Seat], allowed: Sequence[Speaker]
                       ) -> list[Message]:
    """The moderator's prompt: the participants, the transcript, the ids it may pick."""
    who = ", ".join(f"{s.id} ({'seeking help' if s.role == 'client' else 'helping'})"
                    for s in seats)
    lines = "\n".join(f"{u.speaker}: {u.content}" for u in history)
    return [
        {"role": "system", "content": (
            f"You moderate a group conversation between {who}. Decide who should speak next "
            "so that the conversation flows naturally: whoever was asked or addressed answers, "
            "and nobody is left out for long. Answer with a JSON object "
            '{"speaker": "<id>", "reason": "one sentence"}.')},
        {"role": "user", "content": f"{lines}\n\nWho speaks next? One of: {', '.join(allowed)}."},
    ]


#: How a moderator's fallback ends its ``next_speaker_reason`` (counted by the run summary).
FALLBACK_SUFFIX = ": round robin"


def is_moderator_fallback(reason: str | None) -> bool:
    """Whether a turn's ``next_speaker_reason`` says the moderator failed and round robin
    chose (the run summary counts these)."""
    return reason is not None and reason.startswith("moderator") and reason.endswith(FALLBACK_SUFFIX)


class Moderator:
    """A model picks the next speaker among the allowed ids (through the one caller)."""

    def __init__(self, setup: TurnOrderSetup) -> None:
        if setup.moderator_backend is None:
            raise ConfigError("group.next_speaker: llm needs group.moderator_backend")
        self.setup = setup
        self.backend = setup.moderator_backend

    async def choose(self, history: History, session: DialogueSession) -> Choice:
        last = history[len(history) - 1].speaker
        allowed = [p for p in _ids(self.setup) if self.setup.allow_repeat or p != last]
        try:
            result = await session.caller.structured(
                "moderator", self.backend, moderator_messages(history, self.setup.seats, allowed),
                _choice_schema(allowed), session.scope,
                temperature=self.setup.moderator_temperature, max_tokens=80,
                seed=derive_seed(session.seed, "moderator", len(history)),
            )
            value = result.value
        except BackendError as exc:
            return Choice(_round_robin(self.setup, history),
                          f"moderator failed ({type(exc).__name__}){FALLBACK_SUFFIX}")
        if value is None:
            return Choice(_round_robin(self.setup, history),
                          f"moderator gave no usable answer{FALLBACK_SUFFIX}")
        data = value.model_dump()
        return Choice(str(data["speaker"]), f"moderator: {str(data['reason'])[:200]}")


register_next_speaker("round_robin")(RoundRobin)
register_next_speaker("addressed")(Addressed)
register_next_speaker("random")(RandomOrder)
register_next_speaker("llm")(Moderator)
