"""Measurements of an agent, outside it: the audit after each turn, the recall probe after the
dialogue.

Neither changes what the agent does next. Each reads only the agent's public surface — its
speaker, backend and policy, the :class:`~spasm.agents.Turn` it returned, and the prompt it would
see for a next turn (:meth:`~spasm.agents.TurnAgent.next_prompt`) — and neither feeds the cache
estimate, which measures the design, not its measurements.

* **Audit** (``harness.audit``, levels without verify-and-rewrite): the accepted reply is
  checked like a candidate (role ``audit``) and never rewritten, so the boundary-violation rate
  can be compared across levels. The verdict (``mode: audit``) goes to ``turns.checker_verdict``
  and its violations and advice into the control fields of the stored state.
* **Recall probes** (``harness.recall_probe``, at ``harness.probe_depths``): see
  :mod:`spasm.harness.probe`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spasm.agents import derive_seed
from spasm.backends.base import ChatRequest
from spasm.errors import BackendError
from spasm.harness.levels import layers
from spasm.harness.probe import fact_words, probe_question, probe_targets, recall
from spasm.harness.profile import Profile, profile_of, resolve_policy
from spasm.harness.verify import check_candidate, with_verdict
from spasm.history import History
from spasm.projection import Message

if TYPE_CHECKING:
    from spasm.agents import Turn, TurnAgent
    from spasm.config import RunConfig
    from spasm.harness.policy import CharacterPolicy
    from spasm.harness.state import AgentState
    from spasm.session import DialogueSession

__all__ = ["AuditResult", "Auditor", "auditors", "recall_probes"]


@dataclass(frozen=True)
class AuditResult:
    """What an audit adds to a turn's row."""

    verdict: dict[str, Any]
    #: 1 when the checker gave no usable answer (plus a policy fallback on the first audit).
    fallbacks: int
    #: The turn's state with the audit's violations and advice noted (``None`` without state).
    state: AgentState | None

    def verdict_json(self) -> str:
        """``turns.checker_verdict``."""
        return json.dumps(self.verdict, ensure_ascii=False)


class Auditor:
    """Checks one agent's accepted replies in one dialogue (role ``audit``, no rewrite)."""

    def __init__(self, agent: TurnAgent, config: RunConfig, persona: dict[str, Any]) -> None:
        self.agent = agent
        self.config = config
        self.persona = persona
        self.profile: Profile = profile_of(agent.speaker, agent.backend, config, persona)
        self.policy: CharacterPolicy | None = None
        self._pending_fallbacks = 0

    async def setup(self, session: DialogueSession) -> None:
        """Take the agent's policy, or resolve it as the agent would (after ``agent.setup``)."""
        if self.agent.policy is not None:
            self.policy = self.agent.policy
            return
        self.policy, self._pending_fallbacks = await resolve_policy(
            self.profile, self.persona, self.config, session
        )

    async def audit(self, turn: Turn, history: History, session: DialogueSession) -> AuditResult:
        """Check ``turn``, spoken after ``history``."""
        assert self.policy is not None, "Auditor.setup was not awaited"
        seed = derive_seed(session.turn_seed(len(history), turn.speaker), "audit")
        verdict = await check_candidate(
            self.profile, self.policy, turn.state, history, turn.text, session,
            self.config.harness, seed=seed, role="audit", meter=None,
        )
        fallbacks, self._pending_fallbacks = self._pending_fallbacks, 0
        if verdict is None:
            fallbacks += 1
        noted = {"mode": "audit", **(verdict.as_dict() if verdict else
                                      {"pass": None, "fallback": True})}
        state = with_verdict(turn.state, noted) if turn.state is not None else None
        return AuditResult(noted, fallbacks, state)


def auditors(
    agents: Sequence[TurnAgent], levels: Sequence[str], config: RunConfig,
    persona: dict[str, Any],
) -> dict[str, Auditor]:
    """An auditor per agent whose level has no verify layer, when ``harness.audit`` is on."""
    if not config.harness.audit:
        return {}
    return {
        agent.speaker: Auditor(agent, config, persona)
        for agent, level in zip(agents, levels, strict=True)
        if not layers(level).verify
    }


async def recall_probes(
    agent: TurnAgent, history: History, session: DialogueSession, config: RunConfig
) -> list[dict[str, Any]]:
    """Ask the agent what its partner said at each of ``harness.probe_depths``; score in code.

    Each probe is one call (role ``probe``, temperature 0): the prompt the agent would see for
    a next turn plus the question of :func:`~spasm.harness.probe.probe_question`. Empty when
    the partner never spoke. The first message's probe keeps the seed (and so the request) of
    the single probe that came before depth probes.
    """
    partner = "responder" if agent.speaker == "client" else "client"
    targets = probe_targets([u.speaker for u in history.utterances], partner,
                            config.harness.probe_depths)
    if not targets:
        return []
    prompt = agent.next_prompt(history, session)
    backend = config.harness.backend or agent.backend
    out = []
    for target in targets:
        facts = fact_words(history.utterances[target.index].content)
        record: dict[str, Any] = {
            "depth": target.depth, "index": target.index, "partner_message": target.ordinal,
            "distance": len(history) - 1 - target.index,
            "in_window": target.index >= prompt.verbatim_from, "facts": facts,
        }
        where = () if target.ordinal == 1 else (target.index,)
        messages: list[Message] = [
            *prompt.messages, {"role": "system", "content": probe_question(target)}
        ]
        request = ChatRequest(messages=tuple(messages), temperature=0.0, max_tokens=60,
                              seed=derive_seed(session.seed, "probe", agent.speaker, *where))
        try:
            completion = await session.complete("probe", backend, request)
        except BackendError as exc:
            out.append({**record, "answer": None, "recall": None, "error": type(exc).__name__})
            continue
        answer = completion.text.strip()
        out.append({**record, "answer": answer, "recall": recall(facts, answer)})
    return out
