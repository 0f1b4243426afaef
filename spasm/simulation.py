"""One dialogue: the Client opens, the two alternate, the detector chain decides (SPEC §3).

The loop knows agents only as :class:`~spasm.agents.TurnAgent` (each returns a
:class:`~spasm.agents.Turn`) and the termination chain; :func:`build_agents` is the one place
that chooses a plain or a harnessed agent for a level. Audits and recall probes are measurements
taken from outside the agents (:mod:`spasm.harness.measure`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from spasm.agents import (
    PlainAgent,
    Turn,
    TurnAgent,
    client_system_prompt,
    responder_system_prompt,
)
from spasm.calls import Caller
from spasm.config import PairingConfig, RunConfig
from spasm.dataset.rows import CallRow, DialogueRow, ErrorRow, TurnRow
from spasm.errors import BudgetExceededError
from spasm.harness import HarnessedAgent
from spasm.harness.levels import layers, level_label
from spasm.harness.measure import AuditResult, auditors, recall_probes
from spasm.history import History
from spasm.projection import Viewer, messages_digest
from spasm.session import DialogueSession
from spasm.termination import JudgeDetector, RuleDetector, TerminationChain


@dataclass(frozen=True)
class DialogueSpec:
    """Everything that identifies one planned dialogue."""

    dialogue_id: str
    persona: dict[str, Any]
    conversation_index: int
    condition: str
    pairing: PairingConfig
    seed: int
    #: Harness level (A–E) of the Client and of the Responder (SPEC §4).
    levels: tuple[str, str] = ("A", "A")


@dataclass
class DialogueResult:
    """Rows for each table produced by one dialogue."""

    spec: DialogueSpec
    dialogue: DialogueRow | None = None
    turns: list[TurnRow] = field(default_factory=list)
    calls: list[CallRow] = field(default_factory=list)
    error: ErrorRow | None = None


def build_agents(spec: DialogueSpec, config: RunConfig) -> tuple[TurnAgent, TurnAgent]:
    """The Client and the Responder of a dialogue, each with its own frame, each plain or
    harnessed by its level in ``spec.levels`` (the one place that chooses)."""
    d = config.dialogue
    plain = (
        PlainAgent(
            speaker="client",
            backend=spec.pairing.client,
            viewer=Viewer("client", client_system_prompt(spec.persona["card"], d.responder_role)),
            temperature=config.backends[spec.pairing.client].temperatures.client,
            max_tokens=d.max_tokens,
        ),
        PlainAgent(
            speaker="responder",
            backend=spec.pairing.responder,
            viewer=Viewer(
                "responder", responder_system_prompt(d.responder_role, d.responder_instructions)
            ),
            temperature=config.backends[spec.pairing.responder].temperatures.responder,
            max_tokens=d.max_tokens,
        ),
    )
    client, responder = (
        HarnessedAgent(agent, level, config, spec.persona) if layers(level).any else agent
        for agent, level in zip(plain, spec.levels, strict=True)
    )
    return client, responder


def build_chain(config: RunConfig, caller: Caller, spec: DialogueSpec) -> TerminationChain:
    """The termination chain configured for the run."""
    t = config.termination
    detectors: list[Any] = []
    if t.rules:
        detectors.append(RuleDetector(t.window))
    if t.judge:
        judge_backend = t.judge_backend or spec.pairing.client
        temperature = config.backends[judge_backend].temperatures.judge
        detectors.append(JudgeDetector(caller, judge_backend, temperature, seed=spec.seed))
    return TerminationChain(detectors, t.min_utterances)


def _turn_row(spec: DialogueSpec, index: int, t: Turn, audit: AuditResult | None) -> TurnRow:
    # An audit is a measurement: its verdict (and the state it annotates) replace nothing the
    # agent decided, since audited levels have no checker of their own.
    verdict = audit.verdict_json() if audit else (
        json.dumps(t.verdict, ensure_ascii=False) if t.verdict else None
    )
    state = audit.state if audit else t.state
    return TurnRow(
        dialogue_id=spec.dialogue_id,
        turn_index=index,
        speaker=t.speaker,
        text=t.text,
        n_tokens=t.completion.completion_tokens,
        prompt_tokens=t.completion.prompt_tokens,
        latency_s=t.completion.latency_s,
        attempts=t.attempts,
        checker_verdict=verdict,
        flagged=t.flagged,
        messages_sha256=messages_digest(t.messages),
        flag_reason=t.flag_reason,
        intent=t.intent,
        state=state.to_json() if state is not None else None,
        state_clips=len(t.reduction.clips) if t.reduction else 0,
        state_log=t.reduction.log() if t.reduction else None,
        harness_fallbacks=t.fallbacks + (audit.fallbacks if audit else 0),
        cached_prompt_tokens=t.cached_prompt_tokens,
        messages=t.stored_messages(),
        probe=None,
    )


@dataclass
class _Progress:
    """The dialogue so far (kept when a turn fails, for the quarantined transcript)."""

    history: History = field(default_factory=History)
    turns: list[TurnRow] = field(default_factory=list)


async def _converse(
    spec: DialogueSpec, config: RunConfig, session: DialogueSession,
    agents: tuple[TurnAgent, TurnAgent], progress: _Progress,
) -> tuple[str, str]:
    """Set the agents up, then alternate turns until the chain stops the dialogue or the cap;
    returns the termination reason and detail."""
    chain = build_chain(config, session.caller, spec)
    audits = auditors(agents, spec.levels, config, spec.persona)
    for agent in agents:
        await agent.setup(session)
        if agent.speaker in audits:
            await audits[agent.speaker].setup(session)
    for _ in range(config.dialogue.max_turns_per_agent):
        for agent in agents:
            before = progress.history
            t = await agent.turn(before, session)
            audit = None
            if agent.speaker in audits:
                audit = await audits[agent.speaker].audit(t, before, session)
            progress.history = before.append(agent.speaker, t.text)
            progress.turns.append(_turn_row(spec, len(before), t, audit))
        stop = await chain.check(progress.history, session.scope)
        if stop is not None:
            return stop.reason, stop.detail
    return "max_turns", f"cap of {config.dialogue.max_turns_per_agent} turns per agent"


async def _probe(
    agents: tuple[TurnAgent, TurnAgent], history: History, session: DialogueSession,
    config: RunConfig, turns: list[TurnRow],
) -> None:
    """Each agent's recall probes (one per depth), stored on its last turn as
    ``{"probes": [...]}`` (:mod:`spasm.harness.probe`)."""
    for agent in agents:
        probes = await recall_probes(agent, history, session, config)
        own = [t for t in turns if t.speaker == agent.speaker]
        if probes and own:
            own[-1].probe = json.dumps({"probes": probes}, ensure_ascii=False)


async def simulate_dialogue(spec: DialogueSpec, config: RunConfig, caller: Caller) -> DialogueResult:
    """Run one dialogue to its end; failures are returned as an error row, never raised
    (except a budget stop, which ends the whole run).

    Each agent is plain or harnessed by its level (:func:`build_agents`); audits and recall
    probes measure them from outside (:mod:`spasm.harness.measure`).
    """
    session = DialogueSession.open(spec, config, caller)
    agents = build_agents(spec, config)
    progress = _Progress()
    result = DialogueResult(spec)
    try:
        reason, detail = await _converse(spec, config, session, agents, progress)
        if config.harness.recall_probe:
            await _probe(agents, progress.history, session, config, progress.turns)
    except BudgetExceededError:
        raise
    except Exception as exc:
        result.calls = session.scope.records
        result.error = ErrorRow(
            dialogue_id=spec.dialogue_id,
            persona_id=spec.persona["persona_id"],
            condition=spec.condition,
            pairing=spec.pairing.label,
            error_type=type(exc).__name__,
            error=str(exc),
            n_utterances=len(progress.history),
            partial_transcript=json.dumps([[u.speaker, u.content] for u in progress.history]),
            failed_at=datetime.now(UTC),
        )
        return result
    result.turns = progress.turns
    result.calls = session.scope.records
    result.dialogue = _dialogue_row(spec, config, agents, len(progress.history), reason, detail,
                                    session.scope.records, progress.turns)
    return result


def _dialogue_row(
    spec: DialogueSpec, config: RunConfig, agents: tuple[TurnAgent, TurnAgent],
    n_utterances: int, reason: str, detail: str, records: list[CallRow], turns: list[TurnRow],
) -> DialogueRow:
    backends = config.backends
    client, responder = agents
    return DialogueRow(
        dialogue_id=spec.dialogue_id,
        persona_id=spec.persona["persona_id"],
        conversation_index=spec.conversation_index,
        condition=spec.condition,
        harness_level=level_label(*spec.levels),
        pairing=spec.pairing.label,
        client_backend=spec.pairing.client,
        client_model=backends[spec.pairing.client].model,
        responder_backend=spec.pairing.responder,
        responder_model=backends[spec.pairing.responder].model,
        seed=spec.seed,
        responder_role=config.dialogue.responder_role,
        client_system_prompt=client.system_prompt,
        responder_system_prompt=responder.system_prompt,
        n_utterances=n_utterances,
        termination_reason=reason,
        termination_detail=detail,
        prompt_tokens=sum(r.prompt_tokens for r in records),
        completion_tokens=sum(r.completion_tokens for r in records),
        n_calls=len(records),
        harness_fallbacks=sum(t.harness_fallbacks for t in turns),
        status="ok",
    )
