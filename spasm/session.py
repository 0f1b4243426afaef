"""One dialogue's binding: its caller, call scope, condition and seeds, set once.

A :class:`DialogueSession` is what every agent, harness layer and measurement of a dialogue
receives instead of ``(caller, scope, condition, seed)`` threaded through each signature. It
also holds the dialogue's :class:`PrefixTracker`, the estimate of what a provider's prompt cache
would serve, which every agent of the dialogue feeds (one tracker per dialogue: providers cache
on recent requests whoever sent them).

The session is opened from plain values (the dialogue's id, persona id, condition and seed),
so the dialogue layer never sees a plan or a run config.

Seeds are derived here and nowhere else: a turn's seed is ``derive_seed(seed, index,
speaker)``, and every harness call of the turn derives its own from that
(``derive_seed(turn_seed, "reducer")`` …), so the same plan sends the same requests and hits the
same cache entries (tests/test_golden_run.py pins the rows they give).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from spasm.backends.base import CallContext, ChatRequest, Completion, Message
from spasm.calls import Caller, CallScope, Structured
from spasm.seeds import derive_seed
from spasm.tokens import common_prefix_length, count_tokens
from spasm.tools import ToolBelt

__all__ = ["MIN_CACHED_TOKENS", "DialogueSession", "PrefixTracker", "TurnMeter"]

T = TypeVar("T")

#: The smallest shared prefix the cache estimate counts (providers cache in token blocks).
MIN_CACHED_TOKENS = 32


class PrefixTracker:
    """Estimates what a provider's prompt cache would serve, per dialogue.

    Providers cache on exact prefixes of recent requests. For each request we find the longest
    prefix (of the serialised messages) it shares with one of the last ``memory`` requests of
    the dialogue and return the share of its tokens in that prefix. It ignores provider
    minimums (OpenAI caches from 1,024 tokens up, in 128-token steps) and sharing across
    dialogues (the Responder's frame is the same in all of them), so it is an estimate of
    what *this design* makes cacheable, not a bill.
    """

    def __init__(self, memory: int = 8) -> None:
        self.memory = memory
        self._seen: list[str] = []

    @staticmethod
    def _serialise(messages: Sequence[Message]) -> str:
        return "".join(f"\x1e{m['role']}\x1f{m['content']}" for m in messages)

    def observe(self, messages: Sequence[Message]) -> float:
        """Record a request; return the share (0–1) of its prompt a prefix cache could serve."""
        if self.memory <= 0:
            return 0.0
        text = self._serialise(messages)
        best = ""
        for old in self._seen:
            n = common_prefix_length(old, text)
            if n > len(best):
                best = text[:n]
        self._seen = [*self._seen[-(self.memory - 1) :], text] if self.memory > 1 else [text]
        total = count_tokens(text)
        shared = count_tokens(best) if best else 0
        # A few shared characters (the role marker) are not a cache hit: providers cache in
        # blocks of tokens, so count prefixes of MIN_CACHED_TOKENS and more only.
        return min(1.0, shared / total) if total and shared >= MIN_CACHED_TOKENS else 0.0


@dataclass
class DialogueSession:
    """The caller, scope, condition and seed of one dialogue, bound once."""

    caller: Caller
    scope: CallScope
    #: The projection (``ecp``, ``concat`` …) that frames every agent's history.
    condition: str
    #: The dialogue's seed; turns and probes derive theirs from it.
    seed: int
    prefix: PrefixTracker = field(default_factory=lambda: PrefixTracker(0))
    #: The dialogue's scenario, when it has one (handed to code agents in their context).
    scenario_id: str | None = None
    #: A run with tools: the dialogue's tools, world and seats (``None``: agents only speak).
    belt: ToolBelt | None = None

    @classmethod
    def open(
        cls, caller: Caller, dialogue_id: str, persona_id: str, condition: str, seed: int, *,
        estimate_cache: bool = False, scenario_id: str | None = None,
        belt: ToolBelt | None = None,
    ) -> DialogueSession:
        """The session of one dialogue; its calls are logged under its id. The cache estimate
        costs a token count per call, so it is kept only with ``estimate_cache`` (harness
        runs report it)."""
        scope = CallScope(dialogue_id=dialogue_id, persona_id=persona_id)
        prefix = PrefixTracker(16) if estimate_cache else PrefixTracker(0)
        return cls(caller, scope, condition, seed, prefix, scenario_id, belt)

    def context(self, speaker: str, turn_index: int | None) -> CallContext:
        """Where a call of ``speaker``'s turn ``turn_index`` comes from, for its request."""
        return CallContext(self.scope.dialogue_id, speaker, turn_index, self.scenario_id)

    def turn_seed(self, index: int, speaker: str) -> int:
        """The seed of utterance ``index``, spoken by ``speaker``."""
        return derive_seed(self.seed, index, speaker)

    async def complete(self, role: str, backend: str, request: ChatRequest) -> Completion:
        """One logged call of this dialogue (cached, limited and retried by the caller)."""
        return await self.caller.complete(role, backend, request, self.scope)


class TurnMeter:
    """The prompt tokens a prefix cache could serve, summed over one turn's calls."""

    def __init__(self, session: DialogueSession) -> None:
        self._session = session
        self._cached = 0.0

    def add(self, tokens: float) -> None:
        """Count a call whose cacheable tokens are known (a :class:`~spasm.agents.Draft`)."""
        self._cached += tokens

    def count(self, messages: Sequence[Message], result: Structured[T] | None) -> T | None:
        """Count a structured harness call sent with ``messages`` (its re-asks' prompt tokens,
        as its result reports them; ``None``: the call failed and spent nothing counted) and
        return its value."""
        share = self._session.prefix.observe(messages)
        if result is None:
            return None
        self._cached += share * result.prompt_tokens
        return result.value

    @property
    def cached_prompt_tokens(self) -> int:
        """The turn's estimate, rounded once at the end."""
        return round(self._cached)
