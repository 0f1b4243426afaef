"""The termination detector chain (docs/engine.md; tests/test_termination.py pins each rule).

After each exchange the chain decides whether the dialogue has reached a natural end. Nothing
fires before ``min_utterances``. Detectors run in order; the first to fire gives the reason:

* :class:`RuleDetector` (``natural_rule``): closing formulas or the explicit end marker in the
  last ``m`` utterances, or a repetition loop;
* :class:`JudgeDetector` (``natural_judge``): an LLM judge (temperature 0.3) with a structured
  verdict; a judge that never answers in the schema simply does not fire.

The engine adds ``max_turns`` (the cap) and ``error`` (quarantined) itself.

Detectors are registered by name like projections (:func:`register_detector`; the names live
in :data:`spasm.registry.DETECTORS`): ``rules`` and ``judge`` ship with spasm, a plugin may add
more, and ``termination.detectors`` in the config names them. A registered factory is handed a
:class:`DetectorSetup` for each dialogue and returns the :class:`Detector`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, cast

from pydantic import BaseModel, ConfigDict

from spasm.backends.base import Message
from spasm.calls import Caller, CallScope
from spasm.errors import ConfigError
from spasm.history import History, Utterance
from spasm.projection import transcript
from spasm.registry import DETECTORS


@dataclass(frozen=True)
class Stop:
    """Why a detector fired."""

    reason: str
    detail: str


class Detector(Protocol):
    """One link of the chain."""

    name: str

    async def check(self, history: History, scope: CallScope) -> Stop | None:
        """Return a :class:`Stop` to end the dialogue, else ``None``."""
        ...


_CLOSING = re.compile(
    r"\b(good ?bye|bye( for now)?|farewell|take care|see you|have a (great|good|nice|lovely) "
    r"(day|evening|night|weekend)|that'?s all (i needed|for now)|talk (to you )?(later|soon))\b",
    re.I,
)
_MARKERS = ("<END>", "[END]", "<end_of_conversation>")


def _norm(text: str) -> str:
    return " ".join(re.findall(r"[a-z0-9']+", text.lower()))


def _shingles(text: str, n: int = 3) -> set[tuple[str, ...]]:
    words = _norm(text).split()
    return {tuple(words[i : i + n]) for i in range(max(1, len(words) - n + 1))}


def near_duplicate(a: str, b: str, threshold: float = 0.8) -> bool:
    """Jaccard similarity of word 3-grams at or above ``threshold`` (or equal normalised text)."""
    na, nb = _norm(a), _norm(b)
    if not na or not nb:
        return False
    if na == nb:
        return True
    sa, sb = _shingles(a), _shingles(b)
    return len(sa & sb) / len(sa | sb) >= threshold


class RuleDetector:
    """Closing formulas, end markers and repetition loops over the last ``m`` utterances."""

    name = "rules"

    def __init__(self, window: int = 4) -> None:
        self.window = window

    async def check(self, history: History, scope: CallScope) -> Stop | None:
        recent = history.last(self.window)
        if (stop := _end_marker(history, recent)) is not None:
            return stop
        last_two = history.last(2)
        client_last = [u for u in last_two if u.speaker == "client"]
        if client_last and (m := _CLOSING.search(client_last[-1].content)):
            return Stop("natural_rule", f"client closing formula {m.group(0)!r}")
        if len(last_two) == 2 and all(_CLOSING.search(u.content) for u in last_two):
            return Stop("natural_rule", "both sides used closing formulas")
        return _repetition(history, recent)


def _end_marker(history: History, recent: tuple[Utterance, ...]) -> Stop | None:
    """Stop at an end marker in one of the ``recent`` (last) utterances."""
    start = len(history) - len(recent)
    for offset, u in enumerate(recent):
        if any(m in u.content for m in _MARKERS):
            return Stop("natural_rule", f"end marker in {u.speaker} turn {start + offset}")
    return None


def _repetition(history: History, recent: tuple[Utterance, ...]) -> Stop | None:
    """Stop when two of the ``recent`` utterances repeat their speaker's earlier ones."""
    start = len(history) - len(recent)
    repeats = 0
    for i, u in enumerate(recent):
        earlier = history.utterances[: start + i]
        if any(e.speaker == u.speaker and near_duplicate(e.content, u.content) for e in earlier):
            repeats += 1
    if repeats >= 2:
        return Stop("natural_rule", f"repetition loop ({repeats} of the last {len(recent)} "
                    "utterances repeat earlier ones)")
    return None


class GroupRuleDetector:
    """The rules over a group's last utterances: an end marker, every participant closing
    (each one's latest utterance in the last round holds a closing formula), and repetition
    loops (any participant repeating itself)."""

    name = "rules"

    def __init__(self, participants: tuple[str, ...], window: int = 4) -> None:
        self.participants = participants
        #: At least a whole round, so every participant's last turn is seen.
        self.window = max(window, len(participants))

    async def check(self, history: History, scope: CallScope) -> Stop | None:
        recent = history.last(self.window)
        if (stop := _end_marker(history, recent)) is not None:
            return stop
        latest = {u.speaker: u.content for u in recent}
        if len(latest) == len(self.participants) and all(
                _CLOSING.search(text) for text in latest.values()):
            return Stop("natural_rule", "every participant used a closing formula")
        return _repetition(history, recent)


class JudgeVerdict(BaseModel):
    """The judge's structured verdict."""

    model_config = ConfigDict(extra="ignore")

    finished: bool
    reason: str


class JudgeDetector:
    """Asks an LLM whether the conversation has reached a natural end."""

    name = "judge"

    def __init__(self, caller: Caller, backend: str, temperature: float = 0.3, seed: int = 0,
                 participants: tuple[str, ...] | None = None):
        self.caller = caller
        self.backend = backend
        self.temperature = temperature
        self.seed = seed
        #: A group dialogue's participant ids (``None``: a Client and a Responder).
        self.participants = participants

    def _instructions(self) -> str:
        if self.participants is not None:
            return (
                "You read a group conversation between " + ", ".join(self.participants)
                + " and decide whether it has reached a natural end (the people who came for "
                "help are settled or everyone is saying goodbye). Answer with a JSON object "
                "{\"finished\": true|false, \"reason\": \"one sentence\"}."
            )
        return (
            "You read a conversation between a Client and a Responder and decide "
            "whether it has reached a natural end (the Client's need is met or they are "
            "saying goodbye). Answer with a JSON object "
            "{\"finished\": true|false, \"reason\": \"one sentence\"}."
        )

    async def check(self, history: History, scope: CallScope) -> Stop | None:
        messages: list[Message] = [
            {"role": "system", "content": self._instructions()},
            {"role": "user", "content": transcript(history)},
        ]
        verdict = (await self.caller.structured(
            "judge", self.backend, messages, JudgeVerdict, scope,
            temperature=self.temperature, max_tokens=100, seed=self.seed + len(history),
        )).value
        if verdict is not None and verdict.finished:
            return Stop("natural_judge", verdict.reason)
        return None


@dataclass(frozen=True)
class DetectorSetup:
    """What a detector factory is handed for one dialogue."""

    #: The run's one call path, for detectors that ask a model.
    caller: Caller
    #: The backend a judging detector asks (``termination.judge_backend``, else the Client's).
    backend: str
    #: That backend's judge temperature.
    temperature: float
    #: The dialogue's seed (a judge derives each call's seed from it).
    seed: int
    #: ``termination.window``: the utterances a rule looks at.
    window: int
    #: A group dialogue's participant ids, in order (``None``: a Client and a Responder).
    participants: tuple[str, ...] | None = None


#: Builds one dialogue's detector.
DetectorFactory = Callable[[DetectorSetup], Detector]


def register_detector(name: str, *, replace: bool = False
                      ) -> Callable[[DetectorFactory], DetectorFactory]:
    """Register a detector factory under ``name`` (decorator; the names live in
    :data:`spasm.registry.DETECTORS`, where the config checks ``termination.detectors``; a
    plugin replaces a built-in only with ``replace=True``)."""

    def decorator(factory: DetectorFactory) -> DetectorFactory:
        DETECTORS.register(name, replace=replace)(factory)
        return factory

    return decorator


def make_detector(name: str, setup: DetectorSetup) -> Detector:
    """The detector registered under ``name`` for one dialogue; an unknown name is a
    :class:`ConfigError`."""
    factory = cast("DetectorFactory | None", DETECTORS.get(name))
    if factory is None:
        raise ConfigError(f"Unknown termination detector {name!r}; known: {', '.join(DETECTORS.names())}")
    return factory(setup)


@register_detector("rules")
def _rules(setup: DetectorSetup) -> Detector:
    if setup.participants is not None:
        return GroupRuleDetector(setup.participants, setup.window)
    return RuleDetector(setup.window)


@register_detector("judge")
def _judge(setup: DetectorSetup) -> Detector:
    return JudgeDetector(setup.caller, setup.backend, setup.temperature, seed=setup.seed,
                         participants=setup.participants)


class TerminationChain:
    """Detectors in order, gated by a minimum length."""

    def __init__(self, detectors: list[Detector], min_utterances: int = 4) -> None:
        self.detectors = detectors
        self.min_utterances = min_utterances

    async def check(self, history: History, scope: CallScope) -> Stop | None:
        if len(history) < self.min_utterances:
            return None
        for detector in self.detectors:
            stop = await detector.check(history, scope)
            if stop is not None:
                return stop
        return None
