"""The persona stage of a run (README, "What a run writes"): draw candidates, check them by
rules and, if asked, by a model, craft their cards, compile their policies.

The persona *definitions* (schema, sampler, rules, card templates) live in
:mod:`spasm.personas` and call no model; this stage is where models are called, through the
one caller, so the run format (:mod:`spasm.dataset`) can read a schema without loading the LLM
layer.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import anyio
from pydantic import BaseModel, ConfigDict

from spasm.backends.base import ChatRequest, Message
from spasm.calls import Caller, CallScope
from spasm.errors import BackendError, ConfigError
from spasm.personas.crafter import render_persona_card, rewrite_messages
from spasm.personas.persona import Persona
from spasm.personas.sampler import candidates
from spasm.personas.schema import ChoiceField, PersonaSchema
from spasm.personas.sources import DIMENSIONS, SourceCandidate, SourcePersonas
from spasm.personas.validator import PersonaVerdict, llm_validation_messages, rule_violations
from spasm.seeds import derive_seed

#: Compiles an accepted persona (its fields, card and id are read) into its policy:
#: ``(policy JSON, policy version, fell back)``.
PolicyCompiler = Callable[[Persona, CallScope], Awaitable[tuple[str, str, bool]]]

__all__ = [
    "DriftDimensions",
    "PersonaSet",
    "PolicyCompiler",
    "build_personas",
    "build_source_personas",
    "dimension_messages",
    "persona_id",
]


@dataclass
class PersonaSet:
    """Accepted personas and every rejected candidate (a persona_rejections row) with its
    reasons."""

    accepted: list[Persona] = field(default_factory=list)
    rejected: list[dict[str, Any]] = field(default_factory=list)
    #: The call-log rows of the model calls made for accepted personas.
    calls: list[Any] = field(default_factory=list)
    llm_fallbacks: int = 0


def persona_id(schema: PersonaSchema, seed: int, index: int, fields: dict[str, Any]) -> str:
    """Stable id: position plus a short hash of the schema, seed and fields."""
    blob = json.dumps([schema.name, schema.schema_version, seed, fields], sort_keys=True)
    return f"p{index:04d}-{hashlib.sha256(blob.encode()).hexdigest()[:8]}"


async def build_personas(
    schema: PersonaSchema,
    n: int,
    seed: int,
    *,
    caller: Caller | None = None,
    backend: str | None = None,
    llm_validate: bool = False,
    llm_craft: bool = False,
    validator_temperature: float = 0.3,
    crafter_temperature: float = 0.7,
    max_draws_per_persona: int = 200,
    compile_policy: PolicyCompiler | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> PersonaSet:
    """Draw candidates until ``n`` pass the rules (and the LLM check, if on); craft their cards.

    ``on_progress(accepted)`` is called every few hundred draws and at the end (a progress bar:
    drawing a million personas takes minutes).

    With ``compile_policy`` each accepted persona's card is also compiled into its policy
    (docs/harness.md, "The layers"), stored as the ``policy`` JSON column with its
    ``policy_version``; the engine passes the harness's one extraction path
    (:func:`spasm.harness.policy.client_policy`), so this package knows nothing of the harness.
    """
    if (llm_validate or llm_craft) and (caller is None or backend is None):
        raise ConfigError("LLM validation or crafting needs a backend (personas.backend)")
    out = PersonaSet()
    max_draws = n * max_draws_per_persona
    reasons: Counter[str] = Counter()
    stream = candidates(schema, seed)
    draws = 0
    while len(out.accepted) < n:
        if draws >= max_draws:
            top = "; ".join(f"{r} ({c}×)" for r, c in reasons.most_common(3))
            raise ConfigError(
                f"The persona schema's rules rejected {draws - len(out.accepted)} of {draws} "
                f"candidates and only {len(out.accepted)} of {n} personas passed. The rules "
                f"reject nearly everything; loosen them. Most frequent: {top}"
            )
        fields = next(stream)
        draws += 1
        if draws % 256 == 0:
            # Sampling is CPU-bound: give the event loop a moment so Ctrl-C and SIGTERM (which
            # cancel the running task) take effect at once, not after the last persona.
            await anyio.sleep(0)
            if on_progress is not None:
                on_progress(len(out.accepted))
        verdicts: list[dict[str, Any]] = []
        violations = rule_violations(schema, fields)
        if violations:
            reasons.update(v.split(":", 1)[0] for v in violations)
            out.rejected.append({"draw": draws - 1, **fields, "stage": "rules",
                                 "reasons": json.dumps(violations)})
            continue
        verdicts.append({"stage": "rules", "valid": True, "reason": "all rules pass"})
        index = len(out.accepted)
        pid = persona_id(schema, seed, index, fields)
        scope = CallScope(persona_id=pid)
        if llm_validate:
            assert caller is not None and backend is not None
            verdict = (await caller.structured(
                "validator", backend, llm_validation_messages(fields),
                PersonaVerdict, scope, temperature=validator_temperature, max_tokens=120,
                seed=seed + draws,
            )).value
            if verdict is None:
                out.llm_fallbacks += 1
                verdicts.append({"stage": "llm", "valid": True,
                                 "reason": "no parsable verdict; accepted on the rules alone"})
            elif not verdict.valid:
                reasons.update(["llm"])
                out.rejected.append({"draw": draws - 1, **fields, "stage": "llm",
                                     "reasons": json.dumps([verdict.reason])})
                continue
            else:
                verdicts.append({"stage": "llm", "valid": True, "reason": verdict.reason})
        card = render_persona_card(fields)
        source = "template"
        if llm_craft:
            assert caller is not None and backend is not None
            req = ChatRequest(
                messages=tuple(rewrite_messages(card)),
                temperature=crafter_temperature, max_tokens=300, seed=seed + draws,
            )
            try:
                completion = await caller.complete("crafter", backend, req, scope)
                card, source = completion.text.strip(), "llm"
            except BackendError as exc:
                out.llm_fallbacks += 1
                verdicts.append({"stage": "crafter", "valid": True,
                                 "reason": f"rewrite failed ({type(exc).__name__}); template kept"})
        persona = Persona(
            id=pid, index=index, seed=seed, fields=fields, card=card, card_source=source,
            verdicts=json.dumps(verdicts), schema_name=schema.name,
            schema_version=schema.schema_version,
        )
        out.accepted.append(await _with_policy(persona, compile_policy, scope, out))
        out.calls.extend(scope.records)
    if on_progress is not None:
        on_progress(len(out.accepted))
    return out


async def _with_policy(persona: Persona, compile_policy: PolicyCompiler | None, scope: CallScope,
                       out: PersonaSet) -> Persona:
    """``persona`` with the policy compiled from its card (and a fallback counted in ``out``
    when the compilation fell back), or as it is without a compiler."""
    if compile_policy is None:
        return persona
    compiled, version, fell_back = await compile_policy(persona, scope)
    out.llm_fallbacks += fell_back
    return replace(persona, policy=compiled, policy_version=version)


class DriftDimensions(BaseModel):
    """What the extraction call answers: the drift dimensions of a described person."""

    model_config = ConfigDict(extra="ignore", title="DriftDimensions")

    concern: str
    emotion: str
    motivation: str


def dimension_messages(card: str, schema: PersonaSchema, responder_role: str) -> list[Message]:
    """The prompt that reads a free-text persona's concern, emotion and motivation."""
    hints = []
    for name in DIMENSIONS:
        spec = schema.fields.get(name)
        if isinstance(spec, ChoiceField):
            hints.append(f"- {name}: one of {', '.join(c.value for c in spec.values[:40])}")
    known = ("\nUse these values where one fits:\n" + "\n".join(hints)) if hints else ""
    return [
        {
            "role": "system",
            "content": f"You read the description of a person who is about to contact a "
            f"{responder_role}. Say, in a few words each and without inventing facts the "
            "description contradicts: their concern (what they come to talk about, in their own "
            "words), their emotion about it (one word), and their motivation (what they want "
            "from this conversation, starting with a verb such as 'wants' or 'needs'). Answer "
            'with a JSON object {"concern": "...", "emotion": "...", "motivation": "..."}.'
            + known,
        },
        {"role": "user", "content": f"Description:\n{card}"},
    ]


def _source_persona_id(index: int, candidate: SourceCandidate) -> str:
    """Stable id: position plus a short hash of the row's id, card and fields."""
    blob = json.dumps(["source", candidate.source_id, candidate.card, candidate.fields],
                      sort_keys=True, default=str)
    return f"p{index:04d}-{hashlib.sha256(blob.encode()).hexdigest()[:8]}"


async def build_source_personas(
    schema: PersonaSchema,
    source: SourcePersonas,
    chosen: list[SourceCandidate],
    seed: int,
    *,
    caller: Caller | None = None,
    backend: str | None = None,
    temperature: float = 0.3,
    responder_role: str = "customer-service agent",
    compile_policy: PolicyCompiler | None = None,
) -> PersonaSet:
    """The personas of a data file's chosen rows (read and checked by
    :func:`spasm.personas.sources.load_source`, which also gives the rejected rows).

    A row whose card is free text and which lacks a drift dimension of the schema (concern,
    emotion, motivation) gets it from one structured call per row (role ``extract``) through
    the caller: stored in the persona's columns, cached by the caller's cache, logged in the
    calls table. Without a caller (a preview, the start-up check) nothing is extracted. A row
    whose answer never parses keeps the dimension empty and counts as a fallback.
    """
    out = PersonaSet(rejected=list(source.rejected))
    ints = schema.integer_fields()
    for index, candidate in enumerate(chosen):
        fields = dict(candidate.fields)
        pid = _source_persona_id(index, candidate)
        scope = CallScope(persona_id=pid)
        verdicts: list[dict[str, Any]] = [
            {"stage": "source", "valid": True, "reason": f"read from {candidate.where}"}]
        missing = [d for d in candidate.missing_dimensions(schema) if d not in ints]
        if missing and caller is not None and backend is not None:
            answer = (await caller.structured(
                "extract", backend,
                dimension_messages(candidate.card, schema, responder_role),
                DriftDimensions, scope, temperature=temperature, max_tokens=160,
                seed=derive_seed(seed, "extract", candidate.source_id),
            )).value
            if answer is None:
                out.llm_fallbacks += 1
                verdicts.append({"stage": "extract", "valid": True,
                                 "reason": "no parsable answer; " + ", ".join(missing)
                                 + " left empty"})
            else:
                for name in missing:
                    fields[name] = getattr(answer, name).strip() or None
                verdicts.append({"stage": "extract", "valid": True,
                                 "reason": ", ".join(missing) + " extracted from the card"})
        persona = Persona(
            id=pid, index=index, seed=seed, fields=fields, card=candidate.card,
            card_source=candidate.card_source, verdicts=json.dumps(verdicts),
            schema_name=schema.name, schema_version=schema.schema_version,
            source_fields=candidate.raw, source_id=candidate.source_id,
        )
        out.accepted.append(await _with_policy(persona, compile_policy, scope, out))
        out.calls.extend(scope.records)
    return out
