"""One dialogue: the Client opens, the two alternate, the detector chain decides (SPEC §3)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from spasm.agents import (
    Agent,
    client_system_prompt,
    derive_seed,
    messages_digest,
    responder_system_prompt,
)
from spasm.calls import Caller, CallScope
from spasm.config import PairingConfig, RunConfig
from spasm.errors import BudgetExceededError
from spasm.history import History
from spasm.projection import Message, Viewer
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


@dataclass
class DialogueResult:
    """Rows for each table produced by one dialogue."""

    spec: DialogueSpec
    dialogue: dict[str, Any] | None = None
    turns: list[dict[str, Any]] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)
    error: dict[str, Any] | None = None


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


def reconstruct_messages(
    dialogue: dict[str, Any], turns: list[dict[str, Any]], turn_index: int
) -> list[Message]:
    """Recompute, byte for byte, the messages the speaker of ``turn_index`` saw.

    ``dialogue`` is a row of the dialogues table and ``turns`` its turns in order; check the
    result against ``messages_sha256`` with :func:`spasm.agents.messages_digest`.
    """
    from spasm.projection import project

    history = History()
    for t in turns[:turn_index]:
        history = history.append(t["speaker"], t["text"])
    speaker = turns[turn_index]["speaker"]
    prompt = dialogue[f"{speaker}_system_prompt"]
    return project(history, Viewer(speaker, prompt), dialogue["condition"])


async def simulate_dialogue(
    spec: DialogueSpec, config: RunConfig, caller: Caller, *, harness_level: str = "none"
) -> DialogueResult:
    """Run one dialogue to its end; failures are returned as an error row, never raised
    (except a budget stop, which ends the whole run)."""
    client, responder = build_agents(spec, config)
    chain = build_chain(config, caller, spec)
    scope = CallScope(dialogue_id=spec.dialogue_id, persona_id=spec.persona["persona_id"])
    history = History()
    turns: list[dict[str, Any]] = []
    result = DialogueResult(spec)
    reason, detail = "max_turns", f"cap of {config.dialogue.max_turns_per_agent} turns per agent"
    try:
        for _ in range(config.dialogue.max_turns_per_agent):
            for agent in (client, responder):
                index = len(history)
                seed = derive_seed(spec.seed, index, agent.speaker)
                n_records = len(scope.records)
                text, completion, seen = await agent.reply(
                    history, spec.condition, caller, scope, seed
                )
                attempts = sum(1 for r in scope.records[n_records:] if r["role"] == agent.speaker)
                history = history.append(agent.speaker, text)
                turns.append(
                    {
                        "dialogue_id": spec.dialogue_id,
                        "turn_index": index,
                        "speaker": agent.speaker,
                        "text": text,
                        "n_tokens": completion.completion_tokens,
                        "prompt_tokens": completion.prompt_tokens,
                        "latency_s": completion.latency_s,
                        "attempts": attempts,
                        "checker_verdict": None,
                        "flagged": False,
                        "messages_sha256": messages_digest(seen),
                    }
                )
            stop = await chain.check(history, scope)
            if stop is not None:
                reason, detail = stop.reason, stop.detail
                break
    except BudgetExceededError:
        raise
    except Exception as exc:
        result.calls = scope.records
        result.error = {
            "dialogue_id": spec.dialogue_id,
            "persona_id": spec.persona["persona_id"],
            "condition": spec.condition,
            "pairing": spec.pairing.label,
            "error_type": type(exc).__name__,
            "error": str(exc),
            "n_utterances": len(history),
            "partial_transcript": json.dumps([[u.speaker, u.content] for u in history]),
            "failed_at": datetime.now(UTC),
        }
        return result
    backends = config.backends
    result.turns = turns
    result.calls = scope.records
    result.dialogue = {
        "dialogue_id": spec.dialogue_id,
        "persona_id": spec.persona["persona_id"],
        "conversation_index": spec.conversation_index,
        "condition": spec.condition,
        "harness_level": harness_level,
        "pairing": spec.pairing.label,
        "client_backend": spec.pairing.client,
        "client_model": backends[spec.pairing.client].model,
        "responder_backend": spec.pairing.responder,
        "responder_model": backends[spec.pairing.responder].model,
        "seed": spec.seed,
        "responder_role": config.dialogue.responder_role,
        "client_system_prompt": client.viewer.system_prompt,
        "responder_system_prompt": responder.viewer.system_prompt,
        "n_utterances": len(history),
        "termination_reason": reason,
        "termination_detail": detail,
        "prompt_tokens": sum(r["prompt_tokens"] for r in scope.records),
        "completion_tokens": sum(r["completion_tokens"] for r in scope.records),
        "n_calls": len(scope.records),
        "status": "ok",
    }
    return result
