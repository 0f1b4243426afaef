"""One dialogue: the Client opens, the two alternate, the detector chain decides (SPEC §3)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from spasm.agents import Agent, client_system_prompt, derive_seed, responder_system_prompt
from spasm.calls import Caller, CallScope
from spasm.config import PairingConfig, RunConfig
from spasm.dataset.rows import CallRow, DialogueRow, ErrorRow, TurnRow
from spasm.errors import BudgetExceededError
from spasm.harness.levels import level_label
from spasm.harness.prompt import PrefixTracker, messages_json
from spasm.harness.runtime import AgentHarness, TurnResult
from spasm.history import History
from spasm.projection import Viewer, messages_digest
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


def build_agents(spec: DialogueSpec, config: RunConfig) -> tuple[Agent, Agent]:
    """The Client and the Responder of a dialogue, each with its own frame."""
    d = config.dialogue
    client_cfg = config.backends[spec.pairing.client]
    responder_cfg = config.backends[spec.pairing.responder]
    client = Agent(
        speaker="client",
        backend=spec.pairing.client,
        viewer=Viewer("client", client_system_prompt(spec.persona["card"], d.responder_role)),
        temperature=client_cfg.temperatures.client,
        max_tokens=d.max_tokens,
    )
    responder = Agent(
        speaker="responder",
        backend=spec.pairing.responder,
        viewer=Viewer("responder", responder_system_prompt(d.responder_role, d.responder_instructions)),
        temperature=responder_cfg.temperatures.responder,
        max_tokens=d.max_tokens,
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


def _turn_row(
    spec: DialogueSpec, index: int, speaker: str, r: TurnResult, attempts: int
) -> TurnRow:
    return TurnRow(
        dialogue_id=spec.dialogue_id,
        turn_index=index,
        speaker=speaker,
        text=r.text,
        n_tokens=r.completion.completion_tokens,
        prompt_tokens=r.completion.prompt_tokens,
        latency_s=r.completion.latency_s,
        attempts=attempts,
        checker_verdict=json.dumps(r.verdict, ensure_ascii=False) if r.verdict else None,
        flagged=r.flagged,
        messages_sha256=messages_digest(r.messages),
        flag_reason=r.flag_reason,
        intent=r.intent,
        state=r.state.to_json() if r.state is not None else None,
        state_clips=len(r.reduction.clips) if r.reduction else 0,
        state_log=r.reduction.log() if r.reduction else None,
        harness_fallbacks=r.fallbacks,
        cached_prompt_tokens=r.cached_prompt_tokens,
        messages=messages_json(r.messages) if r.stored_messages else None,
        probe=None,
    )


async def simulate_dialogue(spec: DialogueSpec, config: RunConfig, caller: Caller) -> DialogueResult:
    """Run one dialogue to its end; failures are returned as an error row, never raised
    (except a budget stop, which ends the whole run).

    Each agent runs inside its :class:`~spasm.harness.runtime.AgentHarness` at the level of
    ``spec.levels``; at level A that is the plain agent, request for request.
    """
    client, responder = build_agents(spec, config)
    chain = build_chain(config, caller, spec)
    scope = CallScope(dialogue_id=spec.dialogue_id, persona_id=spec.persona["persona_id"])
    history = History()
    turns: list[TurnRow] = []
    result = DialogueResult(spec)
    reason, detail = "max_turns", f"cap of {config.dialogue.max_turns_per_agent} turns per agent"
    # The cache estimate costs a token count per call: only harness runs report it.
    tracker = PrefixTracker(16) if config.harness.active else PrefixTracker(0)
    harness = {
        agent.speaker: AgentHarness(agent, level, config, spec.persona, tracker)
        for agent, level in zip((client, responder), spec.levels, strict=True)
    }
    try:
        for h in harness.values():
            await h.setup(caller, scope)
        for _ in range(config.dialogue.max_turns_per_agent):
            for agent in (client, responder):
                index = len(history)
                seed = derive_seed(spec.seed, index, agent.speaker)
                n_records = len(scope.records)
                r = await harness[agent.speaker].turn(history, spec.condition, caller, scope, seed)
                attempts = sum(
                    1 for rec in scope.records[n_records:] if rec.role in (agent.speaker, "rewrite")
                )
                history = history.append(agent.speaker, r.text)
                turns.append(_turn_row(spec, index, agent.speaker, r, attempts))
            stop = await chain.check(history, scope)
            if stop is not None:
                reason, detail = stop.reason, stop.detail
                break
        if config.harness.recall_probe:
            for speaker, h in harness.items():
                answer = await h.probe(history, spec.condition, caller, scope, spec.seed)
                own = [t for t in turns if t.speaker == speaker]
                if answer is not None and own:
                    own[-1].probe = json.dumps(answer, ensure_ascii=False)
    except BudgetExceededError:
        raise
    except Exception as exc:
        result.calls = scope.records
        result.error = ErrorRow(
            dialogue_id=spec.dialogue_id,
            persona_id=spec.persona["persona_id"],
            condition=spec.condition,
            pairing=spec.pairing.label,
            error_type=type(exc).__name__,
            error=str(exc),
            n_utterances=len(history),
            partial_transcript=json.dumps([[u.speaker, u.content] for u in history]),
            failed_at=datetime.now(UTC),
        )
        return result
    backends = config.backends
    result.turns = turns
    result.calls = scope.records
    result.dialogue = DialogueRow(
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
        client_system_prompt=harness["client"].system_prompt,
        responder_system_prompt=harness["responder"].system_prompt,
        n_utterances=len(history),
        termination_reason=reason,
        termination_detail=detail,
        prompt_tokens=sum(r.prompt_tokens for r in scope.records),
        completion_tokens=sum(r.completion_tokens for r in scope.records),
        n_calls=len(scope.records),
        harness_fallbacks=sum(t.harness_fallbacks for t in turns),
        status="ok",
    )
    return result
