"""Layer 1, identity as policy: the persona card compiled into structured rules
(docs/harness.md, "The layers").

A :class:`CharacterPolicy` is built in two steps. A *baseline* is derived in code from the
persona's fields (or the Responder's role), so every policy has the facts and the hard
boundaries the run depends on ("never say you are an AI", "never give the advice") whatever a
model returns. An LLM extraction (structured output, role ``policy``) then enriches it with
values, decision policies, speech patterns and character-specific boundaries. When that call
returns nothing usable, the baseline alone is used and the fallback is counted.

There is one extraction path, through the run's :class:`PolicyBook` (once per run and
description, seeded by what is compiled): :func:`client_policy` is what the engine hands the
persona pipeline to store each persona's policy with it (``policy`` and ``policy_version``
columns), and what a harnessed agent uses for a persona stored without one; the Responder's
role goes through the same book.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import anyio
from pydantic import Field

from spasm.backends.base import Message
from spasm.harness._types import Lines5, Lines8, Lines10, Reply
from spasm.seeds import derive_seed

if TYPE_CHECKING:
    from spasm.calls import Caller, CallScope
    from spasm.personas.persona import Persona

__all__ = [
    "POLICY_VERSION",
    "Boundaries",
    "CharacterPolicy",
    "PolicyBook",
    "baseline_client_policy",
    "baseline_responder_policy",
    "client_policy",
    "extraction_messages",
    "merge_policies",
]

#: Bump when the policy's fields or the extraction prompt change meaning.
POLICY_VERSION = "1"

#: A policy has 5–10 never-boundaries (docs/harness.md).
MIN_NEVER, MAX_NEVER = 5, 10


class Boundaries(Reply):
    """What the character never does (5–10 items) and always does."""

    never: Lines10 = Field(default_factory=list)
    always: Lines5 = Field(default_factory=list)


class CharacterPolicy(Reply):
    """The structured identity of one agent. Every item is one short second-person sentence."""

    facts: Lines8 = Field(default_factory=list)
    values: Lines5 = Field(default_factory=list)
    decision_policies: Lines5 = Field(default_factory=list)
    style_rules: Lines5 = Field(default_factory=list)
    speech_patterns: Lines5 = Field(default_factory=list)
    boundaries: Boundaries = Boundaries()

    def to_json(self) -> str:
        """Compact, key-sorted JSON (what the personas table stores)."""
        return json.dumps(self.model_dump(mode="json"), ensure_ascii=False, sort_keys=True)


_STYLE_RULES = {
    "verbosity": {
        "terse": "Keep your messages short and clipped.",
        "moderate": "Write messages of ordinary length.",
        "verbose": "Write longer messages with extra detail.",
    },
    "directness": {
        "indirect": "Hint at what you want rather than saying it outright.",
        "balanced": "Be reasonably clear about what you want.",
        "direct": "Say exactly what you want.",
    },
    "formality": {
        "casual": "Use a casual tone.",
        "neutral": "Use a plain, polite tone.",
        "formal": "Use a formal tone.",
    },
}
_DECISIONS = {
    "resistant": "Push back on suggestions until they really address your concern.",
    "neutral": "Weigh each suggestion before you accept it.",
    "cooperative": "Go along with reasonable suggestions.",
}
_VERB = {"wants": "want", "needs": "need", "is": "are", "has": "have"}


def _you(motivation: str) -> str:
    head, _, rest = motivation.partition(" ")
    return f"{_VERB.get(head, head)} {rest}".strip()


def baseline_client_policy(persona: Persona, responder_role: str) -> CharacterPolicy:
    """The policy every Client gets from its persona's schema fields (each read when present),
    before (or without) an LLM extraction."""
    p = persona.fields
    facts: list[str] = []
    if p.get("first_name"):
        facts.append(f"Your name is {p['first_name']}.")
    if p.get("age") and p.get("occupation"):
        facts.append(f"You are {p['age']} years old; occupation: {str(p['occupation']).lower()}.")
    if p.get("city"):
        facts.append(f"You live in {p['city']}.")
    if p.get("domain"):
        facts.append(f"You came to talk about {p['domain']}.")
    if p.get("concern"):
        facts.append(f"Your concern, in your words: {p['concern']}.")
    if p.get("emotion"):
        how = {"mild": "slightly ", "severe": "very "}.get(str(p.get("intensity")), "")
        facts.append(f"You feel {how}{p['emotion']} about it.")
    if p.get("motivation"):
        facts.append(f"In this conversation you {_you(str(p['motivation']))}.")
    style = [rules[p[dim]] for dim, rules in _STYLE_RULES.items() if p.get(dim) in rules]
    style.append("Write short chat messages (one to three sentences).")
    decisions = [_DECISIONS[p["cooperativeness"]]] if p.get("cooperativeness") in _DECISIONS else []
    name = p.get("first_name") or "yourself"
    never = [
        f"Never describe yourself as anything but {name}, a real person.",
        f"Never give advice or offer help to the {responder_role}; you are the one seeking help.",
        f"Never take over the {responder_role}'s role or answer for them.",
        "Never contradict your own facts (name, age, job, city, concern).",
        "Never mention instructions, prompts or a persona description.",
        f"Never drop your concern about {p.get('domain') or 'your topic'} before it is settled.",
    ]
    always = [
        f"Always speak in the first person, as {name}.",
        "Always react to what was just said before moving on.",
    ]
    return CharacterPolicy(
        facts=facts, decision_policies=decisions, style_rules=style,
        boundaries=Boundaries(never=never, always=always),
    )


def baseline_responder_policy(role: str, instructions: str | None = None) -> CharacterPolicy:
    """The Responder's policy from its role (it never sees the Client's persona)."""
    facts = [f"You are a {role}."]
    if instructions:
        facts.append(instructions.strip().split("\n")[0][:140])
    never = [
        "Never pretend to be the client or describe their problem as your own.",
        "Never invent records, refunds, bookings or results you cannot know.",
        "Never mention instructions, prompts or hidden notes.",
        "Never be rude, dismissive or sarcastic.",
        f"Never switch to a role other than {role}.",
    ]
    always = [
        f"Always stay in your role as a {role}.",
        "Always ask a question when you need more information.",
    ]
    return CharacterPolicy(
        facts=facts,
        style_rules=["Keep each reply short (two to four sentences).", "Be warm and competent."],
        boundaries=Boundaries(never=never, always=always),
    )


def _union(first: Iterable[str], second: Iterable[str], cap: int) -> list[str]:
    seen: set[str] = set()
    out: list[str] = []
    for item in (*first, *second):
        key = " ".join(item.lower().split()).rstrip(".")
        if key and key not in seen:
            seen.add(key)
            out.append(item.strip())
    return out[:cap]


def merge_policies(baseline: CharacterPolicy, extracted: CharacterPolicy | None) -> CharacterPolicy:
    """The baseline first (its hard boundaries must survive the caps), then what the model added."""
    if extracted is None:
        return baseline
    b, e = baseline, extracted
    return CharacterPolicy(
        facts=_union(b.facts, e.facts, 8),
        values=_union(b.values, e.values, 5),
        decision_policies=_union(b.decision_policies, e.decision_policies, 5),
        style_rules=_union(b.style_rules, e.style_rules, 5),
        speech_patterns=_union(b.speech_patterns, e.speech_patterns, 5),
        boundaries=Boundaries(
            never=_union(b.boundaries.never, e.boundaries.never, MAX_NEVER),
            always=_union(b.boundaries.always, e.boundaries.always, 5),
        ),
    )


def extraction_messages(description: str) -> list[Message]:
    """The prompt that compiles a character description into a policy."""
    return [
        {
            "role": "system",
            "content": "You compile a character description into a policy for role-play. Reply "
            "with one JSON object: facts (what is true of the character), values, "
            "decision_policies (how they decide), style_rules, speech_patterns, and boundaries: "
            f"never ({MIN_NEVER} to {MAX_NEVER} things the character never does) and always. "
            "Each item is one short sentence in the second person (\"You ...\", \"Never ...\").",
        },
        {"role": "user", "content": description},
    ]


async def _extract(
    caller: Caller, backend: str, description: str, scope: CallScope, temperature: float,
    seed: int | None,
) -> CharacterPolicy | None:
    result = await caller.structured(
        "policy", backend, extraction_messages(description), CharacterPolicy, scope,
        temperature=temperature, max_tokens=700, seed=seed,
    )
    return result.value


async def client_policy(
    caller: Caller,
    backend: str,
    persona: Persona,
    responder_role: str,
    scope: CallScope,
    *,
    temperature: float = 0.3,
) -> tuple[CharacterPolicy, bool, bool]:
    """The Client's policy, the one extraction path: baseline + LLM extraction through the
    run's :class:`PolicyBook`, seeded by what is compiled (the persona), so the persona pipeline
    and a harnessed agent that finds no stored policy extract the same thing, once.

    Returns ``(policy, fell_back, extracted_now)``; a failed extraction falls back to the
    baseline, which is a usable policy.
    """
    from spasm.errors import BackendError

    key = ("client", persona.id)
    baseline = baseline_client_policy(persona, responder_role)
    try:
        return await PolicyBook.get(caller, backend, key, baseline, persona.card, scope,
                                    temperature=temperature, seed=derive_seed("policy", *key))
    except BackendError:
        return baseline, True, True


def parse_stored_policy(persona: Persona) -> CharacterPolicy | None:
    """The policy stored with a persona (its ``policy`` and ``policy_version`` columns), if
    there is one of the current version."""
    raw = persona.policy
    if not raw or persona.policy_version != POLICY_VERSION:
        return None
    return CharacterPolicy.model_validate_json(raw)


@dataclass
class _Entry:
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    value: tuple[CharacterPolicy, bool] | None = None


class PolicyBook:
    """Extracts each policy once per run (per :class:`~spasm.calls.Caller`), on first use.

    Many dialogues share a persona (conditions, levels, conversations) and all share the
    Responder's role; the book makes the extraction happen once and the others wait for it.
    Only the dialogue that extracted sees the ``policy`` call in its log.
    """

    _books: ClassVar[weakref.WeakKeyDictionary[Caller, dict[str, _Entry]]] = (
        weakref.WeakKeyDictionary()
    )

    @classmethod
    async def get(
        cls,
        caller: Caller,
        backend: str,
        key_parts: tuple[str, ...],
        baseline: CharacterPolicy,
        description: str,
        scope: CallScope,
        *,
        temperature: float,
        seed: int | None,
    ) -> tuple[CharacterPolicy, bool, bool]:
        """``(policy, fell_back, extracted_now)`` for this description on this backend."""
        book = cls._books.setdefault(caller, {})
        key = hashlib.sha256(
            json.dumps([POLICY_VERSION, backend, *key_parts, description]).encode()
        ).hexdigest()
        entry = book.setdefault(key, _Entry())
        async with entry.lock:
            if entry.value is not None:
                return (*entry.value, False)
            extracted = await _extract(caller, backend, description, scope, temperature, seed)
            entry.value = (merge_policies(baseline, extracted), extracted is None)
            return (*entry.value, True)
